"""Every device parameter of torch's public API, and what cudashim does with each.

A parameter is device vocabulary when its name is one of ``VOCABULARY``. They are found
from torch itself, never listed by hand: the signatures of the Python API in ``SCOPE``, and
the operator schemas for the functions and Tensor methods written in C++. Each one is
either

- **translated**: a patch group declares it, in its ``REWRITES`` (the one rewriter) or in
  its ``TRANSLATES`` (the parameters its ``install()`` translates by hand);
- **delegated**: torch hands the value on to a translated API (``DELEGATED_TO`` below, and
  every ``nn.Module`` constructor, which passes ``device`` to its factories);
- **untouched**, with the reason, in ``UNTOUCHED_BECAUSE`` below.

``tests/test_device_parameters.py`` enumerates torch's parameters, so a torch release
that adds one fails until it is classified. The device modules (``torch.cuda``,
``torch.xpu``, ...) are outside the scope: ``torch.cuda`` is the proxy, whose own surface
table classifies every name, and a program that names another device module means it.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
from typing import Dict, Iterator, NamedTuple, Optional, Tuple

import torch
import wrapt

VOCABULARY = frozenset({"device", "device_type", "devices", "device_id", "device_ids",
                        "device_index", "output_device", "map_location", "pin_memory_device"})

# Packages walked with every public submodule, and modules read on their own.
SCOPE_PACKAGES = ("torch.accelerator", "torch.amp", "torch.autograd", "torch.distributed",
                  "torch.futures", "torch.jit", "torch.multiprocessing", "torch.nested",
                  "torch.nn", "torch.optim", "torch.package", "torch.signal", "torch.utils")
SCOPE_MODULES = ("torch", "torch.functional", "torch.hub", "torch.random", "torch.serialization",
                 "torch.storage")

TRANSLATED, DELEGATED, UNTOUCHED = "translated", "delegated", "untouched"

_DEVICES_ARE_BOUND = ("called by DistributedDataParallel's forward with the devices it bound, "
                      "which are the target's already")
_OTHER_DEVICE = "names a device type other than CUDA explicitly: the program means it"
_INTERNAL = "torch's own plumbing, reached with devices torch made: they are the target's already"

# "module:attribute.path(parameter)" -> why cudashim leaves it as it is.
UNTOUCHED_BECAUSE: Dict[str, str] = {
    "torch.random:fork_rng(devices)": "indices of fork_rng's device type, which is translated",
    "torch.accelerator:device_index.__init__(device)":
        "an index, which means the same on every accelerator; on the CPU, where torch knows no "
        "accelerator, the 'torch_accelerator' group answers it with torch.cuda.device",
    "torch.utils.checkpoint:set_device_states(devices)":
        "indices of the checkpoint's device type, which is translated",
    "torch.autograd.graph:save_on_cpu.__init__(device_type)":
        "only picks whose is_available() decides pinning: torch asking torch.cuda hears the "
        "truth, so nothing is pinned where there is no CUDA, and the saved tensors go back to "
        "the devices they came from",
    "torch.nn.parallel:DistributedDataParallel.scatter(device_ids)": _DEVICES_ARE_BOUND,
    "torch.nn.parallel:DistributedDataParallel.gather(output_device)": _DEVICES_ARE_BOUND,
    "torch.nn.parallel:DistributedDataParallel.to_kwargs(device_id)": _DEVICES_ARE_BOUND,
    "torch.nn:Module.xpu(device)": _OTHER_DEVICE,
    "torch.nn:Module.ipu(device)": _OTHER_DEVICE,
    "torch.nn:Module.mtia(device)": _OTHER_DEVICE,
    "torch:TypedStorage.hpu(device)": _OTHER_DEVICE,
    **{f"torch:Tensor.{name}(device)": _OTHER_DEVICE for name in ("xpu", "ipu", "mtia")},
    "torch.distributed:Backend.register_backend(devices)":
        "the device types a new collective library serves: the program's own library",
    "torch.distributed:get_default_backend_for_device(device)":
        "answers 'nccl' for CUDA, as it does natively; init_process_group translates 'nccl'",
    "torch.distributed.rpc:TensorPipeRpcBackendOptions.__init__(devices)":
        "RPC device maps drive TensorPipe's CUDA channels; off CUDA, RPC moves tensors through "
        "host memory and needs no devices (not translated: no program in view uses them)",
    "torch.distributed.rpc:TensorPipeRpcBackendOptions.set_devices(devices)":
        "as TensorPipeRpcBackendOptions(devices)",
    "torch.futures:Future.__init__(devices)":
        "CUDA-stream-aware futures for RPC: the same as TensorPipe's devices",
    "torch.jit.mobile:_load_for_lite_interpreter(map_location)":
        "mobile (lite interpreter) models run on the CPU",
    "torch.utils.cpp_extension:include_paths(device_type)":
        "build-time paths of torch's own install; building CUDA code cannot be shimmed",
    "torch.utils.cpp_extension:library_paths(device_type)":
        "build-time paths of torch's own install; building CUDA code cannot be shimmed",
    "torch.multiprocessing.reductions:rebuild_event(device)": _INTERNAL,
    "torch.autograd.profiler_util:Kernel.__new__(device)": _INTERNAL,
    "torch.autograd.profiler_util:FunctionEvent.__init__(device_type)": _INTERNAL,
    "torch.autograd.profiler_util:FunctionEvent.__init__(device_index)": _INTERNAL,
    "torch.autograd.profiler_util:FunctionEvent.append_kernel(device)": _INTERNAL,
    "torch.distributed.tensor.parallel.fsdp:DTensorExtensions.chunk_tensor(device)": _INTERNAL,
}


_HANDED_TO_FACTORIES = "handed to torch's factories, which translate"
_DESERIALIZERS = "torch's registered deserializers, to which the 'serialization' group adds one for CUDA"
_TO_PARALLEL = ("handed to nn.parallel's device index, scatter, gather, broadcast and "
                "parallel_apply, which the 'data_parallel' group replaces")

# "module:attribute.path(parameter)" -> the translated API torch hands the value to.
DELEGATED_TO: Dict[str, str] = {
    "torch.nn:Module.cuda(device)": "Tensor.cuda, for every parameter and buffer",
    "torch.nn:Transformer.generate_square_subsequent_mask(device)": _HANDED_TO_FACTORIES,
    "torch.nn:UninitializedParameter.__new__(device)": _HANDED_TO_FACTORIES,
    "torch.nn:UninitializedBuffer.__new__(device)": _HANDED_TO_FACTORIES,
    "torch.nn.parameter:UninitializedTensorMixin.materialize(device)": _HANDED_TO_FACTORIES,
    "torch.optim.swa_utils:update_bn(device)": "Tensor.to, for every batch",
    "torch.optim.swa_utils:AveragedModel.__init__(device)": "Module.to",
    "torch.hub:load_state_dict_from_url(map_location)": "torch.load",
    # torch hands every map_location form to its registered deserializers, one of which the
    # 'serialization' group registers for storages tagged cuda:N.
    "torch:load(map_location)": _DESERIALIZERS,
    "torch.package.package_importer:PackageImporter.load_pickle(map_location)": _DESERIALIZERS,
    **{f"torch.nn.parallel:{entry}": _TO_PARALLEL for entry in (
        "DataParallel.__init__(device_ids)", "DataParallel.__init__(output_device)",
        "DataParallel.replicate(device_ids)", "DataParallel.scatter(device_ids)",
        "DataParallel.gather(output_device)", "data_parallel(device_ids)",
        "data_parallel(output_device)", "replicate(devices)")},
    **{f"torch.signal.windows:{name}(device)": _HANDED_TO_FACTORIES for name in (
        "bartlett", "blackman", "cosine", "exponential", "gaussian", "general_cosine",
        "general_hamming", "hamming", "hann", "kaiser", "nuttall")},
}


class PrivateEntry(NamedTuple):
    callers: str                # the libraries found calling it, and where
    how: str                    # what cudashim does with it, or why it leaves it
    signature: Optional[str]    # inspect's signature of a Python function, to notice a change


_ABSENT_OFF_CUDA = ("exists only in CUDA builds of torch, which detects its own CUDA build by "
                    "these bindings (torch.cuda._is_compiled), so cudashim adds none: torch's "
                    "own modules would take CUDA paths")
_DEVICE_INDEX = "(device: Any, optional: bool = False, allow_cpu: bool = False) -> int"

# torch's private entry points that widely used libraries call with a device, found by reading
# their sources (bitsandbytes, accelerate, transformers, peft, DeepSpeed, Lightning, timm,
# diffusers, megatron-core): "module:attribute(parameter)" -> the entry. Translated ones are
# declared by a group as the public ones are; tests/test_device_parameters.py checks that each
# still exists with the same signature, or is absent where the entry says it is.
PRIVATE_ENTRY_POINTS: Dict[str, PrivateEntry] = {
    "torch._C._nn:_parse_to(device)": PrivateEntry(
        "bitsandbytes (Int8Params.to, Params4bit.to, Linear8bitLt's state), accelerate "
        "(big_modeling's dispatched-model guard), Lightning (DeviceDtypeModuleMixin.to), "
        "torch's own Module.to",
        "translated by the 'tensors' group, as Tensor.to: the device it parses is the target's",
        None),
    "torch._utils:_get_device_index(device)": PrivateEntry(
        "Lightning (CUDAAccelerator's GPU stats), torch.nn.parallel",
        "translated by the 'data_parallel' group for the program and its libraries: CUDA "
        "indices, as on CUDA; torch's own modules keep the real parser", _DEVICE_INDEX),
    "torch.cuda:_get_device_index(device)": PrivateEntry(
        "DeepSpeed, apex, torch.cuda's own functions",
        "the proxy torch.cuda's private name, by torch.cuda's rules", _DEVICE_INDEX),
    "torch.cuda:_lazy_call(callable)": PrivateEntry(
        "DeepSpeed's CUDA accelerator (lazy_call), Megatron's RNG tracker",
        "the proxy torch.cuda's private name: runs the callable now, the device being ready",
        "(callable, **kwargs)"),
    "torch._C:_get_accelerator(check)": PrivateEntry(
        "transformers (its device mesh and tensor-parallel set-up), diffusers",
        "untouched: it names the target's device type, where the program's tensors are", None),
    "torch._C:_get_privateuse1_backend_name()": PrivateEntry(
        "timm (devices whose optimizers support capturable)",
        "untouched: the name of a PrivateUse1 target is the target's own", None),
    "torch._C:_cuda_getCurrentRawStream(device_index)": PrivateEntry(
        "bitsandbytes (the stream its CUDA kernels run on)",
        f"called only for tensors whose device.type is 'cuda', which bitsandbytes (it hears "
        f"the truth) never has off CUDA; {_ABSENT_OFF_CUDA}", None),
    "torch._C:_cuda_clearCublasWorkspaces()": PrivateEntry(
        "Lightning (its CUDA accelerator's teardown, behind hasattr)",
        f"Lightning checks hasattr first; {_ABSENT_OFF_CUDA}", None),
    "torch._C:_cuda_isInBadFork()": PrivateEntry(
        "accelerate (notebook_launcher's checks)",
        f"the public torch.cuda._is_in_bad_fork answers through the proxy; {_ABSENT_OFF_CUDA}", None),
    "torch._C:_cuda_getDeviceCount()": PrivateEntry(
        "training scripts printing their set-up",
        f"torch.cuda.device_count() is the public answer; {_ABSENT_OFF_CUDA}", None),
}


class Parameter(NamedTuple):
    name: str               # where the program reaches it: "torch.random.fork_rng"
    owner: object           # the function (or method) that takes it
    parameter: str


def enumerate_parameters() -> Iterator[Parameter]:
    """Every device parameter in scope, each function once (the first public name wins)."""
    seen = set()
    for name, function in _public_functions():
        for parameter in _parameter_names(name, function):
            if parameter in VOCABULARY and (id(function), parameter) not in seen:
                seen.add((id(function), parameter))
                yield Parameter(name, function, parameter)


def classify(parameter: Parameter, tables) -> Optional[Tuple[str, str]]:
    """(kind, how or why) for one parameter; None when it is not classified. ``tables`` is
    ``classification_tables()``."""
    key = (id(parameter.owner), parameter.parameter)
    for kind, table in tables.items():
        if key in table:
            return kind, table[key]
    if _is_module_constructor(parameter.owner):
        return DELEGATED, "a module's constructor passes device to its factories, which translate"
    return None


def translated_parameters() -> Dict[Tuple[int, str], str]:
    """(id(function), parameter) -> the group that translates it, from every group's
    declarations."""
    from . import GROUPS, group_module

    found = {}
    for group in GROUPS:
        module = group_module(group)
        pairs = [(d.target, a.parameter) for d in getattr(module, "REWRITES", ()) for a in d.arguments]
        pairs += list(getattr(module, "TRANSLATES", ()))
        for target, parameter in pairs:
            function = resolve(target)
            if function is not None:
                found[(id(function), parameter)] = f"by the '{group}' group"
    return found


def classification_tables() -> Dict[str, Dict[Tuple[int, str], str]]:
    """{kind: {(id(function), parameter): how or why}} for the declared and listed kinds.
    Functions are known by identity: build the tables and enumerate while cudashim is not
    active (active, the names resolve to the replacements)."""
    return {TRANSLATED: translated_parameters(), DELEGATED: _keyed(DELEGATED_TO),
            UNTOUCHED: _keyed(UNTOUCHED_BECAUSE)}


def _keyed(table: Dict[str, str]) -> Dict[Tuple[int, str], str]:
    found = {}
    for entry, reason in table.items():
        target, parameter = split_entry(entry)
        function = resolve(target)
        if function is not None:
            found[(id(function), parameter)] = reason
    return found


def split_entry(entry: str) -> Tuple[str, str]:
    """"module:path(parameter)" -> ("module:path", "parameter")."""
    target, _, parameter = entry.rstrip(")").partition("(")
    return target, parameter


def resolve(target: str):
    """The function behind "module:attribute.path", unwrapped from staticmethod; None when
    this torch lacks it."""
    module_name, _, path = target.partition(":")
    try:
        value = wrapt.resolve_path(importlib.import_module(module_name), path)[2]
    except (ImportError, AttributeError):
        return None
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


# --- finding them ------------------------------------------------------------------------
def _public_functions():
    """(public name, function) for the functions, classes' own methods and C operators in
    scope."""
    from ..proxy.surface import public_names, real_submodules

    # Tensor's methods first: legacy tensor types (torch.FloatTensor) hold the same ones.
    yield from _methods("torch.Tensor", torch.Tensor)
    modules = [importlib.import_module(name) for name in SCOPE_MODULES]
    for package in SCOPE_PACKAGES:
        modules.extend(module for module in real_submodules(importlib.import_module(package))
                       if ".examples" not in module.__name__)        # sample scripts, no API
    for module in modules:
        for attribute in public_names(module):
            value = getattr(module, attribute, None)
            if value is None or isinstance(value, types.ModuleType):
                continue
            name = f"{module.__name__}.{attribute}"
            if isinstance(value, type):
                yield from _methods(name, value)
            elif callable(value):
                yield name, value
    yield from _operators()


def _methods(name, cls):
    if not (cls.__module__ or "").startswith("torch"):
        return
    if cls is torch._C.Generator:
        yield name, cls                  # a C class: its constructor is the class itself
    # A class's own methods; for Tensor and UntypedStorage, their C++ bases' too.
    owners = [cls, *_C_BASES.get(cls, ())]
    for owner in owners:
        for attribute, value in vars(owner).items():
            if attribute.startswith("_") and attribute not in ("__init__", "__new__"):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, (types.FunctionType, types.MethodDescriptorType,
                                  types.BuiltinFunctionType)):
                yield f"{name}.{attribute}", value


_C_BASES = {torch.Tensor: (torch._C.TensorBase,), torch.UntypedStorage: (torch._C.StorageBase,)}


def _operators():
    """The C++ functions and Tensor methods whose operator schema takes a device."""
    for schema in torch._C._jit_get_all_schemas():
        namespace, _, op = schema.name.partition("::")
        if namespace != "aten" or op.startswith("_"):
            continue
        if not any(a.name in VOCABULARY and "Device" in str(a.type) for a in schema.arguments):
            continue
        for owner, attribute, label in _bindings(op):
            yield f"{label}.{attribute}", getattr(owner, attribute)


def _bindings(op):
    """Where torch binds operator ``op`` for Python: torch.X, Tensor.X, torch.fft.X, ..."""
    for prefix, owner, label in (("fft_", torch.fft, "torch.fft"), ("special_", torch.special,
                                                                     "torch.special")):
        if op.startswith(prefix) and hasattr(owner, op[len(prefix):]):
            yield owner, op[len(prefix):], label
    if hasattr(torch, op) and not isinstance(getattr(torch, op), types.ModuleType):
        yield torch, op, "torch"
    if hasattr(torch.Tensor, op):
        yield torch.Tensor, op, "torch.Tensor"


def _parameter_names(name, function):
    return sorted(parameters_of(function) or ())


def parameters_of(function):
    """The parameter names torch gives ``function``: from its signature, or for C++ code
    from its operator schemas and its documented signature; None where torch says nothing."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        parameters = None
    if parameters is not None and not any(p.kind == p.VAR_KEYWORD for p in parameters):
        return {p.name for p in parameters}
    names = set(_schema_parameters(function)) | _documented_parameters(function)
    if parameters is not None:
        names |= {p.name for p in parameters}
    return names or None


def _documented_parameters(function):
    """The names in the signatures a docstring documents, as torch's C++ functions
    ("cuda(device=None, non_blocking=False, ...) -> Tensor") and overloaded Python methods
    (".. function:: to(device=None, dtype=None, non_blocking=False)") do."""
    name = getattr(function, "__name__", None)
    if not name:
        return set()
    found = set()
    for line in (getattr(function, "__doc__", None) or "").splitlines():
        line = line.strip()
        line = line.removeprefix(".. function:: ").removeprefix(".. method:: ")
        if line.startswith(f"{name}("):
            inside = line[len(name) + 1:].partition(")")[0]
            found.update(re.match(r"\s*\**\s*(\w*)", part).group(1) for part in inside.split(","))
    found.discard("")
    return found


def _schema_parameters(function):
    """The parameters of a C++ operator's binding, from the operator's schemas."""
    op = getattr(function, "__name__", "")
    if not op or not any(getattr(owner, name, None) is function for owner, name, _ in _bindings(op)):
        return []                           # not an operator's binding (a Python wrapper, say)
    names = set()
    for schema in torch._C._jit_get_schemas_for_operator(f"aten::{op}"):
        names.update(a.name for a in schema.arguments)
    return sorted(names)


def _is_module_constructor(function) -> bool:
    qualname = getattr(function, "__qualname__", "")
    if not qualname.endswith((".__init__", ".__new__")):
        return False
    module = inspect.getmodule(function)
    owner = getattr(module, qualname.split(".")[0], None)
    return isinstance(owner, type) and issubclass(owner, torch.nn.Module)
