"""torch.compile: compiled code hears the same ``is_cuda`` as eager code, and traces our wrappers.

Dynamo does not call ``Tensor.is_cuda`` while it traces; it answers from the device type
(``device.type == "cuda"``). So for the program's own code it is told what the program
hears in eager mode, and torch's code it traces still hears the truth.

Dynamo cannot look inside the compiled wrappers (``cudashim._speedups``): where they run,
it is shown each one's Python twin instead (its ``python_twin``, which behaves the same),
and traces through that as it traces the pure-Python wrappers.

Inductor generates code for the devices torch knows and those a vendor registered a code
generator for. On a target with none (torchvulkan, cudashim's test accelerator, a vendor
without an inductor backend) it fails deep inside (``KeyError: 'shimdev'``); there a graph on
the target's tensors is compiled by AOTAutograd's eager backend instead (captured as inductor
would capture it, each op on the target's own kernels), and the program is told once.

Dynamo is imported lazily (it costs a second), so the patches wait for that import when it
has not happened.
"""

import wrapt

from .. import torch_names
from ..callers import is_torch_module
from ..errors import warn_once
from ..tables.compiled_twins import TWINS

DYNAMO_TENSORS = "torch._dynamo.variables.tensor"
DYNAMO_BUILDER = "torch._dynamo.variables.builder"
DYNAMO_TRACE_RULES = "torch._dynamo.trace_rules"
DYNAMO_TORCH_FUNCTIONS = "torch._dynamo.variables.torch"
INDUCTOR = "torch._inductor.compile_fx"
# Private dynamo and inductor names are read and patched here: each is in torch_names.NAMES.


def install(activation):
    replaced_methods = _ReplacedTensorMethods(activation.registry)
    _tensor_methods_include_the_ones_replaced(activation, replaced_methods)
    if activation.compiled is not None:
        _trace_python_twins(activation)
    _wrappers_met_without_a_source(activation, replaced_methods)
    _torchs_own_functions_fold_as_their_wrappers(activation)
    _torchs_own_functions_known_behind_their_wrappers(activation)
    if activation.backend.device_type != "cpu":
        _eager_where_inductor_has_no_code_generator(activation)
    if activation.settings.is_honest("is_cuda"):
        return
    device_type = activation.backend.device_type

    def patch(module):
        TensorVariable = module.TensorVariable
        original = TensorVariable.method_attr_is_cuda
        build = torch_names.get("torch._dynamo.variables.base.VariableTracker.build", None)
        if build is None:               # torch before 2.6 makes its constants so
            constant = torch_names.get("torch._dynamo.variables.constant.ConstantVariable.create")
            build = lambda tx, value: constant(value)          # noqa: E731

        def method_attr_is_cuda(self, tx):
            device = self.device
            traced_module = tx.f_globals.get("__name__", "")
            if device is not None and device.type == device_type and not is_torch_module(traced_module):
                return build(tx, True)
            return original(self, tx)

        activation.registry.set_attr(TensorVariable, "method_attr_is_cuda", method_attr_is_cuda)

    activation.when_imported(DYNAMO_TENSORS, patch)


def _tensor_methods_include_the_ones_replaced(activation, replaced_methods):
    """Dynamo puts a call of a Tensor method in the graph where the method is one of the
    set ``trace_rules.get_tensor_method`` builds from ``torch.Tensor``'s attributes: built
    under cudashim, it lacks the methods cudashim replaced (``Tensor.to``, a float16 op's),
    and torch's own method handed to a torch function mode in compiled code was a graph
    break. The originals are added."""
    def patch(trace_rules):
        import functools
        original = getattr(trace_rules, "get_tensor_method", None)
        if original is None:
            return

        @functools.lru_cache(maxsize=None)
        def get_tensor_method():
            return frozenset(original()) | frozenset(replaced_methods().values())
        activation.registry.set_attr(trace_rules, "get_tensor_method", get_tensor_method)

    activation.when_imported(DYNAMO_TRACE_RULES, patch)


class _ReplacedTensorMethods:
    """{id of what ``torch.Tensor`` holds now for a method cudashim replaced: torch's own
    method}, for the methods torch wrote in C; built again where patches were added since."""

    def __init__(self, registry):
        self.registry = registry
        self.counted = -1
        self.methods = {}

    def __call__(self) -> dict:
        if self.counted != len(self.registry):
            import types

            import torch
            kinds = (types.MethodDescriptorType, types.WrapperDescriptorType, types.BuiltinFunctionType)
            replaced = {}
            for patch in self.registry:
                if patch.owner is torch.Tensor and not patch.is_item and isinstance(patch.original, kinds):
                    replaced.setdefault(patch.name, patch.original)    # the first patch's: torch's own
            self.methods = {id(getattr(torch.Tensor, name, None)): method for name, method in replaced.items()}
            self.counted = len(self.registry)
        return self.methods


def _trace_python_twins(activation):
    # The compiled types (the table of twins): those whose instances carry a twin say so in it.
    compiled_types = tuple(getattr(activation.compiled, name) for name in TWINS)

    def patch(module):
        VariableBuilder = module.VariableBuilder
        original = VariableBuilder._wrap

        def _wrap(self, value):
            if type(value) in compiled_types and "python_twin" in getattr(value, "__dict__", ()):
                # Read when first met, not when the builder is imported: dynamo's other modules
                # may be half-imported then (torch 2.7 imports trace_rules after it).
                rule_map = torch_names.get("torch._dynamo.trace_rules.get_torch_obj_rule_map")
                ID_MATCH = torch_names.get("torch._dynamo.guards.GuardBuilder.ID_MATCH")
                TYPE_MATCH = torch_names.get("torch._dynamo.guards.GuardBuilder.TYPE_MATCH")
                AttrSource = torch_names.get("torch._dynamo.source.AttrSource")
                rule = rule_map().get(value)
                if rule is not None:
                    # Torch's table was built after activation, so it names the wrapper
                    # itself (``torch.zeros``): an op in the graph, as the twin would be.
                    self.install_guards(ID_MATCH)
                    return rule.create_with_source(value, source=self.source)
                # Guarded as dynamo guards a functools.partial: the wrapper's type, and the
                # twin it traces by identity.
                self.install_guards(TYPE_MATCH)
                twin_source = AttrSource(self.get_source(), "python_twin")
                return VariableBuilder(self.tx, twin_source)(value.python_twin)
            return original(self, value)

        activation.registry.set_attr(VariableBuilder, "_wrap", _wrap)

    activation.when_imported(DYNAMO_BUILDER, patch)


def _wrappers_met_without_a_source(activation, replaced_methods):
    """A wrapper dynamo meets without a source: the op a torch function mode is handed (the
    program's own mode, or ``torch.set_default_device``'s), which torch names by its public
    attribute, the wrapper itself. A Tensor method's is torch's own method, as dynamo puts a
    method call in the graph where no mode sees it (tracing the wrapper traced the policy's
    buffers, and broke the graph); a compiled wrapper's twin is traced, as for one with a
    source."""
    compiled_types = tuple(getattr(activation.compiled, name) for name in TWINS) \
        if activation.compiled is not None else ()

    def patch(_):
        SourcelessBuilder = torch_names.get("torch._dynamo.variables.builder.SourcelessBuilder", None)
        create = getattr(SourcelessBuilder, "create", None)
        if create is None:
            return

        def create_for_wrapper(tx, value):
            method = replaced_methods().get(id(value))
            if method is not None:
                value = method
            elif type(value) in compiled_types and "python_twin" in getattr(value, "__dict__", ()):
                value = value.python_twin
            return create(tx, value)
        activation.registry.set_attr(SourcelessBuilder, "create", staticmethod(create_for_wrapper))

    activation.when_imported(DYNAMO_BUILDER, patch)


def _behind_wrappers(registry, listed) -> list:
    """torch's functions behind the wrappers whose ids are in ``listed`` (a set, which grows by
    theirs): each patch's original, where its replacement is listed, through chains of wrappers."""
    behind = []
    grown = True
    while grown:                            # a wrapper's original may be another's wrapper
        grown = False
        for made in registry:
            original = made.original
            if id(made.replacement) in listed and callable(original) and id(original) not in listed:
                listed.add(id(original))
                behind.append(original)
                grown = True
    return behind


def _torchs_own_functions_known_behind_their_wrappers(activation):
    """Dynamo knows torch's functions by identity, from a table it builds at its first compile
    (``trace_rules.get_torch_obj_rule_map``): under cudashim, after activation, it names the
    wrappers where torch's namespaces hold them. Where dynamo traces into a wrapper, the
    wrapper's own call of torch's function may be one no namespace holds any more (the precision
    policy replaces both ``torch.conv2d`` and ``F.conv2d``, the exact reductions
    ``torch.cosine_similarity``): dynamo took it for an unknown builtin, and broke the graph
    ("Dynamo does not know how to trace the builtin"). Each function behind a wrapper the table
    names is given the wrapper's rule, as the table gives it without cudashim."""
    registry = activation.registry

    def patch(trace_rules):
        import functools
        original = getattr(trace_rules, "get_torch_obj_rule_map", None)
        if original is None:
            return

        @functools.lru_cache(maxsize=None)
        def with_the_functions_behind(patches: int) -> dict:
            known = dict(original())
            rules = {id(value): rule for value, rule in known.items()}
            # in the order they are found, so that a wrapper behind another has its rule first
            for function in _behind_wrappers(registry, set(rules)):
                rule = next((rules[id(made.replacement)] for made in registry
                             if made.original is function and id(made.replacement) in rules), None)
                if rule is not None:
                    known[function] = rules[id(function)] = rule
            return known

        def get_torch_obj_rule_map():
            return with_the_functions_behind(len(registry))

        def cache_clear():                  # dynamo's clear_lru_cache() clears torch's table
            with_the_functions_behind.cache_clear()
            getattr(original, "cache_clear", lambda: None)()
        get_torch_obj_rule_map.cache_clear = cache_clear
        get_torch_obj_rule_map.__wrapped__ = original
        activation.registry.set_attr(trace_rules, "get_torch_obj_rule_map", get_torch_obj_rule_map)

    activation.when_imported(DYNAMO_TRACE_RULES, patch)


# The tables of the torch functions whose calls dynamo folds to their value, by identity
# (the second guards the value it folds to).
_FOLDED = ("constant_fold_functions", "constant_fold_functions_need_guards")


def _torchs_own_functions_fold_as_their_wrappers(activation):
    """Dynamo folds a call of some torch functions to its value (``torch.is_autocast_enabled``,
    ``torch.cuda.is_available``), found by identity in tables it builds when it is imported:
    under cudashim, after activation, they hold the wrappers. Where dynamo traces into a wrapper
    (a device rewrite's, the precision policy's check for an autocast region), the wrapper's own
    call of torch's function was a graph break ("torch.* op returned non-Tensor": a float16
    GPT under torch.compile broke at every linear layer). The functions behind the wrappers in
    each table are added to it."""
    def patch(module):
        for table_name in _FOLDED:
            table = torch_names.get(f"{DYNAMO_TORCH_FUNCTIONS}.{table_name}", None)
            if not isinstance(table, (list, dict)):
                continue
            behind = _behind_wrappers(activation.registry, {id(function) for function in table})
            if behind:
                extended = {**table, **dict.fromkeys(behind)} if isinstance(table, dict) else [*table, *behind]
                activation.registry.set_attr(module, table_name, extended)

    activation.when_imported(DYNAMO_TORCH_FUNCTIONS, patch)


def _eager_where_inductor_has_no_code_generator(activation):
    device_type = activation.backend.device_type

    def compile_fx(compile, _, args, kwargs):
        import torch
        get_scheduling_for_device = torch_names.get(
            "torch._inductor.codegen.common.get_scheduling_for_device")
        torch_names.get("torch._inductor.codegen.common.init_backend_registration", lambda: None)()
        graph, inputs = (list(args) + [kwargs.get("model_"), kwargs.get("example_inputs_")])[:2]
        on_target = any(isinstance(value, torch.Tensor) and value.device.type == device_type
                        for value in inputs or ())
        if not on_target or get_scheduling_for_device(device_type) is not None:
            return compile(*args, **kwargs)
        warn_once("inductor-" + device_type,
                  f"torch.compile: inductor has no code generator for the '{device_type}' device; "
                  f"its graphs compile with AOTAutograd's eager backend (backend='aot_eager'): "
                  f"captured as inductor captures them, each op on the device's own kernels")
        aot_eager = torch_names.get("torch._dynamo.backends.debugging.aot_eager")
        return aot_eager(graph, inputs)

    activation.when_imported(INDUCTOR, lambda module: activation.replace(
        module, "compile_fx", lambda original: wrapt.FunctionWrapper(original, compile_fx)))
