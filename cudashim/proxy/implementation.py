"""cudashim's own implementations of ``torch.cuda`` names, on top of a backend.

Each class stands for one ``torch.cuda`` module and declares what it implements by what it
defines, as gevent's replacement modules do with ``__implements__``: every public attribute
of the class body (plus ``extra_names()``) is a name of that module. The proxy binds them
on an instance built for the activation. Names the backend answers directly are not here:
they are generated from the Backend interface (``forwarders.py``). Device arguments follow
torch.cuda's rules (``forwarders.device_index``).
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Dict, Tuple

import torch

from .. import legacy_types
from ..cuda_build import cuda_build
from .forwarders import forwarded_as
from .graphs import CudaGraphs
from .implementation_base import Implementation


class TorchCuda(CudaGraphs):
    """``torch.cuda`` itself (its graph names: ``graphs.py``)."""
    module = "torch.cuda"
    private = ("_get_device_index", "_lazy_call", "_lazy_init")

    def _get_device_index(self, device, optional: bool = False, allow_cpu: bool = False) -> int:
        """torch.cuda's own device-argument parser, which libraries call (torch/cuda/_utils)."""
        names_the_cpu = device == "cpu" or (isinstance(device, torch._C.device) and device.type == "cpu"
                                            and self.backend.device_type != "cpu")
        if allow_cpu and names_the_cpu:
            return -1
        if isinstance(device, self.device):
            return device.idx
        index = self.idx(device, optional=True)
        if index is not None:
            return index
        # torch.cuda refuses a device without an index unless told it may be the current
        # one. CUDA devices on the CPU backend are the CPU, which has no index: current.
        if not optional and (device is None or str(device) == "cuda"):
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        return self.backend.current_device()

    # --- lazy initialization ----------------------------------------------------------
    # Megatron's and DeepSpeed's RNG trackers set generator states through
    # ``torch.cuda._lazy_call``, which holds a call back until CUDA initializes. CUDA never
    # does under the shim, so their states would silently never be set (tensor-parallel
    # ranks then initialize their replicated weights differently). The device the program
    # calls CUDA is the target's, and it is ready now.
    def _lazy_init(self) -> None:
        target_init = getattr(self.backend.module, "_lazy_init", None)
        if target_init is not None:
            target_init()

    def _lazy_call(self, callable, **kwargs) -> None:
        self._lazy_init()
        callable()

    # --- devices ----------------------------------------------------------------------
    def set_device(self, device) -> None:
        index = self.idx(device, optional=False)
        if index is not None and index >= 0:         # torch.cuda ignores negative indices
            self.backend.set_device(index)

    @functools.cached_property
    def device(self):
        backend, idx = self.backend, self.idx

        class device:
            """``with torch.cuda.device(i):`` makes device ``i`` current for the block."""

            def __init__(self, device):
                self.idx = -1 if device is None else idx(device)
                self.prev_idx = -1

            def __enter__(self):
                if self.idx is not None and self.idx >= 0:
                    self.prev_idx = backend.current_device()
                    if self.prev_idx != self.idx:
                        backend.set_device(self.idx)

            def __exit__(self, *exc):
                if self.idx is not None and self.idx >= 0 and self.prev_idx != self.idx:
                    backend.set_device(self.prev_idx)
                return False

        device.__module__ = "torch.cuda"
        return device

    @functools.cached_property
    def device_of(self):
        backend = self.backend

        class device_of(self.device):           # a class, as torch.cuda's is
            """``with torch.cuda.device_of(tensor):`` makes the tensor's device current for the
            block; a host tensor changes nothing."""

            def __init__(self, obj):
                on_target = isinstance(obj, torch.Tensor) and obj.device.type == backend.device_type
                super().__init__(obj.device.index if on_target else -1)

        device_of.__module__ = "torch.cuda"
        return device_of

    def can_device_access_peer(self, device, peer_device) -> bool:
        first, second = self.idx(device, optional=False), self.idx(peer_device, optional=False)
        count = self.backend.device_count()
        return 0 <= first < count and 0 <= second < count and first != second

    # --- RNG --------------------------------------------------------------------------
    def get_rng_state_all(self):
        return [self.backend.get_rng_state(i) for i in range(self.backend.device_count())]

    def set_rng_state_all(self, new_states) -> None:
        for i, state in enumerate(new_states):
            self.backend.set_rng_state(state, i)

    @functools.cached_property
    def default_generators(self):
        return tuple(self.backend.default_generator(i) for i in range(self.backend.device_count()))

    # --- streams ----------------------------------------------------------------------
    def set_stream(self, stream) -> None:
        if stream is not None:
            self.backend.set_stream(stream)

    def stream(self, stream):
        return contextlib.nullcontext() if stream is None else self.backend.stream(stream)

    @functools.cached_property
    def StreamContext(self):
        open_stream = self.stream

        class StreamContext:
            """``with torch.cuda.StreamContext(s):`` makes ``s`` current for the block."""

            def __init__(self, stream):
                self.stream = stream
                self._context = None

            def __enter__(self):
                self._context = open_stream(self.stream)
                return self._context.__enter__()

            def __exit__(self, *exc):
                return self._context.__exit__(*exc)

        StreamContext.__module__ = "torch.cuda"
        return StreamContext

    # --- memory: deprecated aliases keep their old meaning ------------------------------
    memory_cached = forwarded_as("memory_reserved")
    max_memory_cached = forwarded_as("max_memory_reserved")
    reset_max_memory_allocated = forwarded_as("reset_peak_memory_stats")
    reset_max_memory_cached = forwarded_as("reset_peak_memory_stats")
    device_memory_used = forwarded_as("memory_allocated")

    def reset_accumulated_memory_stats(self, device=None) -> None:
        self.idx(device)                   # no accumulated counters are kept on this target

    def memory_stats_as_nested_dict(self, device=None) -> dict:
        nested: dict = {}
        for key, value in self.backend.memory_stats(self.idx(device)).items():
            node = nested
            *path, leaf = key.split(".")
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = value
        return nested

    def memory_summary(self, device=None, abbreviated=False) -> str:
        backend, index, mib = self.backend, self.idx(device), 2 ** 20
        return (f"|  cudashim memory summary, {backend.name} backend, device {index or 0}\n"
                f"|  allocated: {backend.memory_allocated(index) / mib:.1f} MiB current, "
                f"{backend.max_memory_allocated(index) / mib:.1f} MiB peak\n"
                f"|  reserved:  {backend.memory_reserved(index) / mib:.1f} MiB current, "
                f"{backend.max_memory_reserved(index) / mib:.1f} MiB peak\n")

    def memory_snapshot(self, mempool_id=None) -> list:
        return []                          # no allocator segments exist to list on this target

    def memory_usage(self, device=None) -> int:
        free, total = self.backend.mem_get_info(self.idx(device))
        return int(round(100 * (total - free) / total)) if total else 0

    def list_gpu_processes(self, device=None) -> str:
        index = self.idx(device) or 0
        return (f"{self.backend.name}:{index}\nprocess {os.getpid():>10d} uses "
                f"{self.backend.memory_allocated(index) / 2 ** 20:12.3f} MB")

    @functools.cached_property
    def _fractions(self) -> dict:
        return {}

    def set_per_process_memory_fraction(self, fraction, device=None) -> None:
        if not isinstance(fraction, (float, int)):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if not 0 <= fraction <= 1:
            raise ValueError(f"Invalid fraction value: {fraction}. Allowed range: 0~1")
        self._fractions[self.idx(device) or 0] = float(fraction)

    def get_per_process_memory_fraction(self, device=None) -> float:
        return self._fractions.get(self.idx(device) or 0, 1.0)

    def get_allocator_backend(self) -> str:
        return "native"

    def ipc_collect(self) -> None:
        pass

    def host_memory_stats(self) -> dict:
        return {}                          # no pinned host allocator runs on this target

    def host_memory_stats_as_nested_dict(self) -> dict:
        return {}

    def reset_peak_host_memory_stats(self) -> None:
        pass

    def reset_accumulated_host_memory_stats(self) -> None:
        pass

    # --- state, capabilities and feature checks ---------------------------------------
    # torch's own modules reach the real functions instead of these (proxy/module.py).
    def is_available(self) -> bool:
        if self.settings.is_honest("is_available"):
            return self.real_module.is_available()
        return self.backend.device_count() > 0

    def is_initialized(self) -> bool:
        return True

    def init(self) -> None:
        pass

    def get_arch_list(self) -> list:
        """What torch's wheels of the CUDA line the program hears are built for, with the
        device's own architecture (``cuda_build``)."""
        build = cuda_build(self.settings.cuda_version)
        return list(build.with_architecture(self.backend.get_device_capability(None)))

    def get_gencode_flags(self) -> str:
        return ""

    def is_tf32_supported(self) -> bool:
        return False                       # TF32 is an NVIDIA tensor-core format

    has_half = True
    has_magma = False

    def get_sync_debug_mode(self) -> int:
        return 0

    def set_sync_debug_mode(self, debug_mode) -> None:
        if debug_mode not in (0, 1, 2, "default", "warn", "error"):
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")

    # --- legacy tensor and storage classes ----------------------------------------------
    @classmethod
    def extra_names(cls):
        return tuple(legacy_types.TENSOR_CLASSES) + tuple(legacy_types.STORAGE_CLASSES)

    def exports(self):
        return {**super().exports(), **_legacy_classes(self.backend)}


class _LegacyTypeMeta(type):
    """``isinstance(t, torch.cuda.FloatTensor)``: a float32 tensor on the target."""

    def __instancecheck__(cls, obj):
        return (isinstance(obj, torch.Tensor) and obj.dtype == cls.dtype
                and obj.device.type == cls.target_type)


def _legacy_classes(backend) -> dict:
    target = backend.target_device(None)
    classes = {}
    for name, dtype in legacy_types.TENSOR_CLASSES.items():
        def make_tensor(cls, *args, _dtype=dtype, **kwargs):
            legacy = torch.empty(0, dtype=_dtype).new(*args, **kwargs)
            return legacy.to(target)
        classes[name] = _LegacyTypeMeta(name, (), {
            "__new__": make_tensor, "dtype": dtype, "target_type": backend.device_type,
            "_cudashim_legacy_name": f"torch.cuda.{name}", "__module__": "torch.cuda"})
    for name, dtype in legacy_types.STORAGE_CLASSES.items():
        def make_storage(cls, *args, _dtype=dtype, **kwargs):
            return torch.TypedStorage(*args, dtype=_dtype, device=target, **kwargs)
        classes[name] = type(name, (), {"__new__": make_storage, "__module__": "torch.cuda"})
    return classes


class _CudaAutocast(torch.amp.autocast):
    """``torch.cuda.amp.autocast``: autocast on the target device."""

    def __init__(self, enabled: bool = True, dtype=torch.float16, cache_enabled: bool = True):
        # "cuda" is translated by the patched torch.amp.autocast.__init__.
        super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)


class _CudaGradScaler(torch.amp.GradScaler):
    """``torch.cuda.amp.GradScaler``: gradient scaling on the target device."""

    def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True):
        super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                         backoff_factor=backoff_factor, growth_interval=growth_interval,
                         enabled=enabled)


for _cls, _name in ((_CudaAutocast, "autocast"), (_CudaGradScaler, "GradScaler")):
    _cls.__module__, _cls.__name__, _cls.__qualname__ = "torch.cuda.amp", _name, _name


class TorchCudaAmp(Implementation):
    """``torch.cuda.amp``: the CUDA spellings of torch.amp, on the target."""
    module = "torch.cuda.amp"

    autocast = _CudaAutocast
    GradScaler = _CudaGradScaler

    @staticmethod
    def custom_fwd(fwd=None, *, cast_inputs=None):
        return torch.amp.custom_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)

    @staticmethod
    def custom_bwd(bwd=None):
        return torch.amp.custom_bwd(bwd, device_type="cuda")

    def amp_definitely_not_available(self) -> bool:
        return self.backend.device_count() == 0


class TorchCudaNccl(Implementation):
    """``torch.cuda.nccl``: NCCL's own bindings do not exist off CUDA; its version is the one
    the CUDA build the program hears ships (``init_process_group("nccl")`` runs on the
    target's collective library)."""
    module = "torch.cuda.nccl"

    @staticmethod
    def is_available(tensors=None) -> bool:
        return False

    def version(self) -> Tuple[int, int, int]:
        return cuda_build(self.settings.cuda_version).nccl


class TorchCudaComm(Implementation):
    """``torch.cuda.comm``: broadcast, scatter, gather and reduce between the target's devices
    by CUDA index (``cudashim.parallel.comm``)."""
    module = "torch.cuda.comm"

    def __init__(self, activation, real_module):
        super().__init__(activation, real_module)
        from ..parallel.comm import DeviceComm
        self._comm = DeviceComm(self.backend, activation.translator.for_api("torch.cuda.comm"))

    @classmethod
    def extra_names(cls):
        from ..parallel.comm import COMM_NAMES
        return COMM_NAMES

    def exports(self):
        return {**super().exports(), **self._comm.functions()}


class TorchCudaNvtx(Implementation):
    """``torch.cuda.nvtx``: NVTX ranges become ranges of torch's own profiler
    (``record_function``), so they appear in a ``torch.profiler`` trace on every target, and in
    Intel VTune through ITT on XPU. Outside a profiler a range costs about a microsecond, as
    an NVTX range does outside Nsight."""
    module = "torch.cuda.nvtx"

    def __init__(self, activation, real_module):
        super().__init__(activation, real_module)
        import threading
        from torch.profiler import itt
        self._pushed = threading.local()                # range_push/pop nest per thread
        self._started: Dict[int, object] = {}           # range_start/end may cross threads
        self._next_id = iter(range(1, 2 ** 63)).__next__
        self._itt = itt if self.backend.device_type == "xpu" and itt.is_available() else None

    def _open(self, msg):
        scope = torch.autograd.profiler.record_function(str(msg))
        scope.__enter__()
        if self._itt is not None:
            self._itt.range_push(str(msg))
        return scope

    def _close(self, scope) -> None:
        if self._itt is not None:
            self._itt.range_pop()
        scope.__exit__(None, None, None)

    def range_push(self, msg) -> int:
        """Open a nested range; returns its zero-based depth, as NVTX does."""
        stack = self._pushed.__dict__.setdefault("stack", [])
        stack.append(self._open(msg))
        return len(stack) - 1

    def range_pop(self) -> int:
        """Close the innermost range; returns its depth, or -1 when none is open (NVTX's
        error value)."""
        stack = self._pushed.__dict__.setdefault("stack", [])
        if not stack:
            return -1
        self._close(stack.pop())
        return len(stack)

    def range_start(self, msg) -> int:
        """Open a range that may end on another thread; returns its id."""
        range_id = self._next_id()
        self._started[range_id] = self._open(msg)
        return range_id

    def range_end(self, range_id) -> None:
        scope = self._started.pop(range_id, None)
        if scope is not None:
            self._close(scope)

    def mark(self, msg) -> None:
        """An instant: a range that ends where it starts."""
        self._close(self._open(msg))

    def range(self, msg, *args, **kwargs):
        """``with torch.cuda.nvtx.range("step {}", i):`` (also a decorator, as NVTX's is)."""
        return _NvtxRange(self, msg.format(*args, **kwargs))


class _NvtxRange(contextlib.ContextDecorator):
    def __init__(self, nvtx, msg):
        self.nvtx, self.msg = nvtx, msg

    def __enter__(self):
        self.nvtx.range_push(self.msg)
        return self

    def __exit__(self, *exc):
        self.nvtx.range_pop()
        return False


IMPLEMENTATIONS = {cls.module: cls for cls in (TorchCuda, TorchCudaAmp, TorchCudaComm, TorchCudaNccl,
                                                TorchCudaNvtx)}
