"""Every public name of the real ``torch.cuda`` and its submodules, classified.

BACKEND   the backend answers it: a Backend method marked ``@cuda_api`` (forwarders.py)
SHIM      cudashim's own implementation, on top of the backend (implementation.py)
SAME      the real object is right everywhere (exception classes)
SUBMODULE a proxied submodule
REFUSED   no equivalent: raises UnsupportedCudaAPI naming the way out
HARMLESS  no equivalent, but doing nothing is safe: by default a no-op that warns once
          (answering what doing nothing means, ``HARMLESS_ANSWERS``); refused under
          ``unsupported="raise"``

BACKEND, SHIM and SUBMODULE are derived from the code that provides them (``proxy/surface.py``
classifies a name, reading this table); the table below
holds only the names that need a reason (SAME, REFUSED, HARMLESS). A name in a submodule
that is the very object of a name in an enclosing package
(``torch.cuda.memory.memory_allocated`` is ``torch.cuda.memory_allocated``) is classified
by that package's entry. ``tests/test_cuda_surface.py`` enumerates the real modules, so a
torch release that adds names fails until they are classified.
"""

from __future__ import annotations

import importlib
import pkgutil
import sys
import types
from typing import Dict, Iterator, Tuple

BACKEND, SHIM, SAME, SUBMODULE, REFUSED, HARMLESS = (
    "backend", "shim", "same", "submodule", "refused", "harmless")

_USE_DISTRIBUTED = "use torch.distributed collectives, which cudashim maps to the target's library"
_NO_ALLOCATOR = "remove the call: the target's runtime manages its own memory"
_NO_NVML = "query the device with its vendor's monitoring tool; NVML exists only for NVIDIA GPUs"
_NO_CUDA_LIBS = "this handle belongs to a CUDA library (cuBLAS, cuSOLVER, cudart) the target lacks"
_NO_PROFILER = "use torch.profiler, which cudashim maps to the target's profiler activity"
_NO_TUNABLE = "TunableOp tunes CUDA/ROCm GEMMs only; remove the call on this target"
_NO_SPARSE_LEGACY = "create sparse tensors with torch.sparse_coo_tensor(..., device='cuda')"

# name -> (kind, way out for REFUSED / HARMLESS or None)
SURFACE: Dict[str, Dict[str, Tuple[str, str]]] = {
    "torch.cuda": {
        "CudaError": (SAME, None),
        "DeferredCudaCallError": (SAME, None),
        "ExternalStream": (REFUSED, "streams made outside torch exist only in the CUDA runtime"),
        "get_stream_from_external": (REFUSED, "streams made outside torch exist only in the CUDA runtime"),
        "GreenContext": (REFUSED, "green contexts partition NVIDIA SMs; run without them"),
        "MemPool": (REFUSED, _NO_ALLOCATOR),
        "MemPoolContext": (REFUSED, _NO_ALLOCATOR),
        "use_mem_pool": (REFUSED, _NO_ALLOCATOR),
        "CUDAPluggableAllocator": (REFUSED, _NO_ALLOCATOR),
        "change_current_allocator": (REFUSED, _NO_ALLOCATOR),
        "caching_allocator_alloc": (REFUSED, "allocate a tensor with torch.empty(..., device='cuda')"),
        "caching_allocator_delete": (REFUSED, "free memory by dropping the tensor"),
        "caching_allocator_enable": (HARMLESS, _NO_ALLOCATOR),
        "caching_allocator_disabled": (REFUSED, _NO_ALLOCATOR),
        "cudart": (REFUSED, _NO_CUDA_LIBS),
        "check_error": (REFUSED, _NO_CUDA_LIBS),
        "cudaStatus": (REFUSED, _NO_CUDA_LIBS),
        "current_blas_handle": (REFUSED, _NO_CUDA_LIBS),
        "current_solver_handle": (REFUSED, _NO_CUDA_LIBS),
        "clock_rate": (REFUSED, _NO_NVML),
        "power_draw": (REFUSED, _NO_NVML),
        "temperature": (REFUSED, _NO_NVML),
        "utilization": (REFUSED, _NO_NVML),
    },
    "torch.cuda.gds": {n: (REFUSED, "GPUDirect Storage exists only for NVIDIA GPUs; use torch.load/save")
                       for n in ["gds_register_buffer", "gds_deregister_buffer", "GdsFile"]},
    "torch.cuda.nccl": {
        **{n: (REFUSED, _USE_DISTRIBUTED) for n in [
            "all_reduce", "reduce", "broadcast", "all_gather", "reduce_scatter", "init_rank",
            "unique_id"]},
    },
    "torch.cuda.profiler": {n: (HARMLESS, _NO_PROFILER) for n in ["start", "stop", "profile", "init"]},
    "torch.cuda.sparse": {n: (REFUSED, _NO_SPARSE_LEGACY) for n in [
        "BFloat16Tensor", "ByteTensor", "CharTensor", "DoubleTensor", "FloatTensor",
        "HalfTensor", "IntTensor", "LongTensor", "ShortTensor"]},
    "torch.cuda.tunable": {n: (HARMLESS, _NO_TUNABLE) for n in [
        "enable", "is_enabled", "tuning_enable", "tuning_is_enabled", "record_untuned_enable",
        "record_untuned_is_enabled", "set_max_tuning_duration", "get_max_tuning_duration",
        "set_max_tuning_iterations", "get_max_tuning_iterations", "set_filename",
        "get_filename", "get_results", "get_validators", "read_file", "tune_gemm_in_file",
        "mgpu_tune_gemm_in_file", "set_rotating_buffer_size", "get_rotating_buffer_size",
        "set_numerical_check_tolerances", "write_file", "write_file_on_exit"]},
}

# Names of older releases that later ones dropped (torch 2.7 has them, 2.13 does not): classified
# for the programs that run on those releases, not stale where this torch lacks them.
OLDER_TORCH_ONLY = frozenset({
    "torch.cuda.MemPoolContext", "torch.cuda.profiler.init", "torch.cuda.tunable.write_file",
    "torch.cuda.tunable.write_file_on_exit"})

# What a harmless API answers when it does nothing (None where it names no answer): TunableOp
# is off and has tuned nothing; the CUDA profiler's capture range is an empty block.
HARMLESS_ANSWERS: Dict[str, object] = {
    "torch.cuda.tunable.is_enabled": False,
    "torch.cuda.tunable.tuning_is_enabled": False,
    "torch.cuda.tunable.record_untuned_is_enabled": False,
    "torch.cuda.tunable.get_max_tuning_duration": 0,
    "torch.cuda.tunable.get_max_tuning_iterations": 0,
    "torch.cuda.tunable.get_rotating_buffer_size": 0,
    "torch.cuda.tunable.get_filename": "",
    "torch.cuda.tunable.get_results": (),
    "torch.cuda.tunable.get_validators": (),
    "torch.cuda.tunable.read_file": False,
    "torch.cuda.tunable.write_file": False,
}
HARMLESS_CONTEXTS = frozenset({"torch.cuda.profiler.profile"})

UNCLASSIFIED_WAY_OUT = ("this torch release added it after cudashim's table was written; "
                        "please report it")


def public_names(module: types.ModuleType):
    """A module's public API: its ``__all__`` plus the public names it defines itself."""
    names = set(getattr(module, "__all__", ()))
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name, None)
        if isinstance(value, types.ModuleType):
            if value.__name__ == f"{module.__name__}.{name}":
                names.add(name)                      # a submodule of this package
            continue
        if getattr(value, "__module__", None) == module.__name__:
            names.add(name)
    return sorted(names)


def real_submodules(package: types.ModuleType) -> Iterator[types.ModuleType]:
    """The package and every public submodule below it, imported."""
    yield package
    for info in pkgutil.iter_modules(getattr(package, "__path__", [])):
        if info.name.startswith("_"):
            continue
        try:
            sub = importlib.import_module(f"{package.__name__}.{info.name}")
        except Exception:          # a submodule that cannot import on this build is no API here
            continue
        yield from real_submodules(vars(sub).get("_cudashim_real", sub))   # past a proxy


def enclosing_owner(real_top: types.ModuleType, module: types.ModuleType, name: str):
    """The nearest enclosing package that exposes the very same object under ``name``."""
    value = getattr(module, name, None)
    parts = module.__name__.split(".")
    for depth in range(len(parts) - 1, 1, -1):
        package_name = ".".join(parts[:depth])
        package = real_top if package_name == real_top.__name__ else sys.modules.get(package_name)
        package = vars(package).get("_cudashim_real", package) if package is not None else None
        if package is not None and hasattr(package, name) and getattr(package, name) is value:
            return package
    return None
