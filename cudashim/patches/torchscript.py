"""TorchScript: scripted code compiles against our replacements and runs on the target.

TorchScript knows torch's functions by identity (``torch.jit._builtins``' table, keyed by
``id``), so a replaced ``torch.zeros`` would look like Python to compile ("can't get
source"): every replacement made while active is entered under its original's op, and
taken out again on deactivation. Annotations are compared by identity too, with what
torch holds now (``ann is torch.device``): a class, real or stand-in, is read as the one
torch holds (an annotation made before activation names the real class). Compiled code
runs in C++, so the CUDA devices it names are rewritten in each graph as it is compiled
(TorchScript's emit hooks) or loaded (``torch.jit.load``).

On a target other than the CPU, scripted code runs unoptimized, each op recording its own
autograd node as eager code does. TorchScript's autocast pass puts the casts into a graph for
CUDA and the CPU only; on any other device eager autocast casts inside each op, while the
optimized graph's backward formulas read the op's inputs as they were before the cast: a
scripted model trained under the target's autocast failed in linear's backward ("expected m1
and m2 to have the same dtype", NVIDIA's EfficientNet recipe with ``--jit script``). The
optimizations given up there are the fusers, which generate code for CUDA and the CPU only,
and the grouping of a graph's autograd nodes.

This group goes first: the builtin table must hear of every replacement the others make.
"""

import atexit
import functools
import importlib
import inspect
import sys

import torch
import torch.jit._builtins
import torch.jit.annotations

from .. import torch_names
from ..patching.class_proxy import real_class
from ..patching.rewriter import DEVICE, rewrite, rewritten
from . import _graphs

# torch.jit.load takes one device as map_location; the loaded graphs are retargeted too.
LOAD = rewrite("torch.jit._serialization:load", DEVICE, parameter="map_location", api="torch.jit.load")
TRANSLATES = ((LOAD.target, "map_location"),)          # by install(), with the retargeting


def install(activation):
    _follow_replacements_in_builtin_table(activation.registry)
    _compiling_replaced_python_functions_as_their_originals(activation)
    activation.replace(torch.jit.annotations, "try_ann_to_type", _reading_classes_as_torch_holds_them)
    translate = activation.translator.for_api("torch.jit")
    _retarget_compiled_graphs(activation.registry, translate)
    original_load = torch.jit._serialization.load
    load = rewritten(activation, LOAD, _retargeting_loads(original_load, translate))
    activation.registry.set_attr(torch.jit._serialization, "load", load)
    if torch.jit.load is original_load:
        activation.registry.set_attr(torch.jit, "load", load)
    if activation.backend.device_type not in AUTOCAST_PASS_DEVICES:
        _run_graphs_unoptimized(activation.registry)


# The devices TorchScript's autocast pass casts for inside a graph (torch/csrc/jit/passes/autocast.cpp).
AUTOCAST_PASS_DEVICES = ("cuda", "cpu")


def _run_graphs_unoptimized(registry):
    get = torch_names.get("torch._C._get_graph_executor_optimize", None)
    set_ = torch_names.get("torch._C._set_graph_executor_optimize", None)
    if get is None or set_ is None:
        return
    was = get()
    set_(False)
    registry.add_undo("TorchScript's graph executor optimizes again", lambda: set_(was))


def _follow_replacements_in_builtin_table(registry):
    table = torch.jit._builtins._get_builtin_table()     # built now, from the originals

    def enter_replacement(original, replacement):
        op = table.get(id(original))
        if op is not None and id(replacement) not in table:
            registry.set_item(table, id(replacement), op)

    registry.watch(enter_replacement)


def _compiling_replaced_python_functions_as_their_originals(activation):
    """A Python function of torch's that a group replaced (``F.group_norm`` where float16 is
    widened, ``torch.tensordot``) is compiled as its original, as without cudashim.

    TorchScript compiles only what ``inspect.isfunction`` calls a function, from its source. A
    compiled gate is not one: TorchScript took it for an opaque Python call, which it could
    not type (an internal assert, for ``torch.tensordot``), ran in Python where it could
    (``nn.GroupNorm``: a scripted module that cannot be saved), and its boolean-dispatch lookup,
    by weak reference, refused it first (``torch.jit.script(nn.GroupNorm(...))`` failed: "cannot
    create weak reference to 'HalfGate'"). That lookup is TorchScript's first question about a
    Python value that is no builtin, and its answer names what to compile: a replacement is
    answered with its original's own dispatch where torch has one (``F.max_pool2d``'s on
    ``return_indices``), else with one that takes the original whatever the call passes.
    Scripted code runs torch's kernels, in C++; its devices are rewritten as each graph is
    emitted."""
    lookup = torch_names.get("torch._jit_internal._try_get_dispatched_fn", None)
    if lookup is None:
        return
    originals = {}                     # id(replacement) -> (replacement, original)

    def enter_replacement(original, replacement):
        if inspect.isfunction(original) and replacement is not original:
            originals[id(replacement)] = (replacement, original)

    activation.registry.watch(enter_replacement)

    def looking_up(lookup):
        @functools.wraps(lookup)
        def _try_get_dispatched_fn(function):
            entry = originals.get(id(function))
            if entry is None or entry[0] is not function:
                return lookup(function)
            original = entry[1]
            return lookup(original) or {"if_true": original, "if_false": original, "index": sys.maxsize,
                                        "arg_name": _NO_CALL_PASSES_THIS, "default": True}
        return _try_get_dispatched_fn

    activation.replace(importlib.import_module(lookup.__module__), "_try_get_dispatched_fn", looking_up)


# The flag of the dispatch that always takes the original: at a position and under a name no
# call has, so that its default, True, decides.
_NO_CALL_PASSES_THIS = "_cudashim_original"


def _reading_classes_as_torch_holds_them(original):
    @functools.wraps(original)
    def try_ann_to_type(ann, *args, **kwargs):
        if isinstance(ann, type):
            held = getattr(torch, ann.__name__, None)
            if held is not None and held is not ann and real_class(held) is real_class(ann):
                ann = held
        return original(ann, *args, **kwargs)
    return try_ann_to_type


def _retarget_compiled_graphs(registry, translate):
    """Rewrite the devices of each function and module TorchScript emits while active."""
    previous_module_hook, previous_function_hook = torch._C._jit_get_emit_hooks()

    def module_emitted(module):
        for name in module._method_names():
            _graphs.retarget_with_callees(module._get_method(name).graph, translate)
        if previous_module_hook is not None:
            previous_module_hook(module)

    def function_emitted(function):
        _graphs.retarget_with_callees(function.graph, translate)
        if previous_function_hook is not None:
            previous_function_hook(function)

    installed = [True]

    def restore_hooks():
        # torch hands back wrappers of the hooks, not these functions: nothing to compare
        # against, so they are restored once, on deactivation or at exit.
        if installed:
            installed.clear()
            torch._C._jit_set_emit_hooks(previous_module_hook, previous_function_hook)

    def restore_hooks_now():
        restore_hooks()
        atexit.unregister(restore_hooks)

    torch._C._jit_set_emit_hooks(module_emitted, function_emitted)
    registry.add_undo("TorchScript's emit hooks", restore_hooks_now)
    # Python functions left in TorchScript's hooks crash the interpreter's finalisation.
    atexit.register(restore_hooks)


def _retargeting_loads(original, translate):
    """``torch.jit.load`` whose modules run on the target: the devices the saved code names
    are rewritten in every method of every submodule."""
    @functools.wraps(original)
    def load(*args, **kwargs):
        module = original(*args, **kwargs)
        for submodule in module.modules():
            methods = submodule._c
            for name in methods._method_names():
                _graphs.retarget_with_callees(methods._get_method(name).graph, translate)
        return module
    return load
