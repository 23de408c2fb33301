"""nn.DataParallel, nn.parallel's primitives and torch.nn.parallel.comm on the target's devices.

torch's ``DataParallel`` and ``data_parallel`` ask torch which device type to use; torch's
internals hear the truth, so on the CPU they find none ("device type could not be
determined"), and the primitives under them call NCCL bindings and CUDA streams that exist
only in CUDA builds. Here the CUDA vocabulary stays (``torch.device("cuda", i)``, which the
device patches translate), the devices are the target's (``device_count()`` of them, the
virtual ones of ``--device-count`` included), and the primitives are ``cudashim.parallel``'s.
torch's own ``DataParallel``, ``replicate``, ``scatter_kwargs`` and ``gather`` code runs on
them unchanged, so replicas, buffers, kwargs, ``dim`` and ``output_device`` behave as on CUDA.
"""

import sys

from ..parallel.apply import parallel_apply_for
from ..parallel.comm import DeviceComm
from ..parallel.functions import autograd_functions
from ..patching.by_caller import answer_by_caller

_PARALLEL = "torch.nn.parallel"
# The device parameters this group's replacements take. DataParallel, data_parallel and
# replicate take theirs too and hand them to what is replaced here (device_parameters.py).
TRANSLATES = (
    ("torch._utils:_get_device_index", "device"),
    (f"{_PARALLEL}:parallel_apply", "devices"),
    *((f"{_PARALLEL}.comm:{name}", "devices") for name in ("broadcast", "broadcast_coalesced", "scatter")),
)


def install(activation):
    backend, set_attr = activation.backend, activation.registry.set_attr
    comm = DeviceComm(backend, activation.translator.for_api("nn.parallel"))
    module = sys.modules.__getitem__            # all imported with torch.nn

    for name, function in comm.functions().items():
        set_attr(module(f"{_PARALLEL}.comm"), name, function)
    # replicate() imports Broadcast from _functions when it runs; scatter_gather took its own
    # references to Scatter and Gather at import.
    functions = autograd_functions(comm)
    for name, function in functions.items():
        set_attr(module(f"{_PARALLEL}._functions"), name, function)
    for name in ("Scatter", "Gather"):
        set_attr(module(f"{_PARALLEL}.scatter_gather"), name, functions[name])

    parallel_apply = parallel_apply_for(comm)
    for owner in (f"{_PARALLEL}.parallel_apply", _PARALLEL, f"{_PARALLEL}.data_parallel"):
        set_attr(module(owner), "parallel_apply", parallel_apply)

    def get_device_index(device, optional=False, allow_cpu=False):
        return comm.index(device, optional=optional, allow_cpu=allow_cpu)

    set_attr(module(f"{_PARALLEL}.replicate"), "_get_device_index", get_device_index)
    # DataParallel's choice of devices: CUDA's, on the target.
    data_parallel = module(f"{_PARALLEL}.data_parallel")
    set_attr(data_parallel, "_get_device_index", get_device_index)
    set_attr(data_parallel, "_get_available_device_type",
             lambda: "cuda" if backend.device_count() > 0 else None)
    set_attr(data_parallel, "_get_all_device_indices", lambda: list(range(backend.device_count())))
    # The same parser where libraries reach it (Lightning's GPU stats, torch.nn.parallel's
    # callers): CUDA indices, as on CUDA; torch's own modules keep the real one.
    set_attr(module("torch._utils"), "_get_device_index", answer_by_caller(
        activation, "torch._utils._get_device_index", module("torch._utils")._get_device_index,
        get_device_index, f"cudashim on {backend.name}"))
    set_attr(data_parallel, "_get_devices_properties",
             lambda device_ids: [backend.get_device_properties(i) for i in device_ids])
