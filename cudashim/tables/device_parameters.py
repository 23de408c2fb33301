"""Every device parameter of torch's public API, and what cudashim does with each.

A parameter is device vocabulary when its name is one of ``VOCABULARY``. They are found
from torch itself, never listed by hand (``patching/device_parameters.py`` walks the
signatures of the Python API in ``SCOPE`` and the operator schemas of the functions and Tensor
methods written in C++). Each one is either

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

from typing import Dict, NamedTuple, Optional

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


ABSENT_OFF_CUDA = ("exists only in CUDA builds of torch, which detects its own CUDA build by "
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
        f"the truth) never has off CUDA; {ABSENT_OFF_CUDA}", None),
    "torch._C:_cuda_clearCublasWorkspaces()": PrivateEntry(
        "Lightning (its CUDA accelerator's teardown, behind hasattr)",
        f"Lightning checks hasattr first; {ABSENT_OFF_CUDA}", None),
    "torch._C:_cuda_isInBadFork()": PrivateEntry(
        "accelerate (notebook_launcher's checks)",
        f"the public torch.cuda._is_in_bad_fork answers through the proxy; {ABSENT_OFF_CUDA}", None),
    "torch._C:_cuda_getDeviceCount()": PrivateEntry(
        "training scripts printing their set-up",
        f"torch.cuda.device_count() is the public answer; {ABSENT_OFF_CUDA}", None),
}
