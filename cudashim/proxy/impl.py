"""cudashim's own implementations of ``torch.cuda`` names, on top of a backend.

``build(backend, settings)`` returns, per proxied module, the objects that stand for the
names classified BACKEND or SHIM in ``surface.py``. Device arguments follow torch.cuda's
rules: ``None`` (current device), an index, ``"cuda:N"`` or a ``torch.device`` of type
cuda, and also the target's own devices, since translated tensors report those.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Optional

import torch

from .. import _state
from ..errors import warn_once

# The dtypes of the legacy ``torch.cuda.<Name>Tensor`` / ``<Name>Storage`` classes.
LEGACY_DTYPES = {
    "BFloat16": torch.bfloat16, "Bool": torch.bool, "Byte": torch.uint8, "Char": torch.int8,
    "Double": torch.float64, "Float": torch.float32, "Half": torch.float16,
    "Int": torch.int32, "Long": torch.int64, "Short": torch.int16,
    "ComplexDouble": torch.complex128, "ComplexFloat": torch.complex64,
}
LEGACY_TENSOR_NAMES = {f"torch.cuda.{k}Tensor": v for k, v in LEGACY_DTYPES.items()
                       if not k.startswith("Complex")}
TENSOR_TYPE_NAME_BY_DTYPE = {v: k for k, v in LEGACY_TENSOR_NAMES.items()}


def device_index(backend, device, optional: bool = True) -> Optional[int]:
    """The CUDA index a torch.cuda device argument names (None: the current device)."""
    if device is None:
        if optional:
            return None
        raise ValueError("Expected a cuda device, but got: None")
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    parsed = device if isinstance(device, torch.device) else torch.device(device)
    if parsed.type not in ("cuda", backend.device_type):
        raise ValueError(f"Expected a cuda device, but got: {parsed}")
    return parsed.index


def build(backend, settings) -> dict:
    """{module name: {attribute: object}} for every BACKEND and SHIM name."""
    return {"torch.cuda": _top_level(backend, settings), "torch.cuda.amp": _amp(backend),
            "torch.cuda.nccl": {"is_available": lambda tensors=None: False}}


def _top_level(backend, settings) -> dict:
    idx = functools.partial(device_index, backend)
    ns = {}

    def export(fn):
        ns[fn.__name__] = fn
        return fn

    # --- BACKEND: devices -----------------------------------------------------------
    export_all = [
        ("device_count", lambda: backend.device_count()),
        ("current_device", lambda: backend.current_device()),
        ("is_bf16_supported", lambda including_emulation=True: backend.is_bf16_supported(including_emulation)),
        ("empty_cache", lambda: backend.empty_cache()),
    ]
    for name, fn in export_all:
        fn.__name__ = fn.__qualname__ = name
        ns[name] = fn

    @export
    def set_device(device) -> None:
        index = idx(device, optional=False)
        if index is not None and index >= 0:
            backend.set_device(index)

    @export
    def synchronize(device=None) -> None:
        backend.synchronize(idx(device))

    @export
    def get_device_name(device=None) -> str:
        return backend.get_device_name(idx(device))

    @export
    def get_device_properties(device=None):
        return backend.get_device_properties(idx(device))

    @export
    def get_device_capability(device=None):
        return backend.get_device_capability(idx(device))

    # --- BACKEND: RNG -----------------------------------------------------------------
    @export
    def manual_seed(seed) -> None:
        backend.manual_seed(int(seed))

    @export
    def manual_seed_all(seed) -> None:
        backend.manual_seed_all(int(seed))

    @export
    def seed() -> None:
        backend.seed()

    @export
    def seed_all() -> None:
        backend.seed_all()

    @export
    def initial_seed() -> int:
        return backend.initial_seed()

    @export
    def get_rng_state(device="cuda"):
        return backend.get_rng_state(idx(device))

    @export
    def set_rng_state(new_state, device="cuda") -> None:
        backend.set_rng_state(new_state, idx(device))

    @export
    def get_rng_state_all():
        return [backend.get_rng_state(i) for i in range(backend.device_count())]

    @export
    def set_rng_state_all(new_states) -> None:
        for i, state in enumerate(new_states):
            backend.set_rng_state(state, i)

    ns["default_generators"] = tuple(backend.default_generator(i)
                                     for i in range(backend.device_count()))

    # --- BACKEND: streams and events ---------------------------------------------------
    ns["Stream"] = backend.Stream
    ns["Event"] = backend.Event

    @export
    def current_stream(device=None):
        return backend.current_stream(idx(device))

    @export
    def default_stream(device=None):
        return backend.default_stream(idx(device))

    @export
    def set_stream(stream) -> None:
        if stream is not None:
            backend.set_stream(stream)

    @export
    def stream(stream):
        return contextlib.nullcontext() if stream is None else backend.stream(stream)

    class StreamContext:
        """``with torch.cuda.StreamContext(s):`` makes ``s`` current for the block."""

        def __init__(self, stream):
            self.stream = stream
            self._context = None

        def __enter__(self):
            self._context = stream(self.stream)
            return self._context.__enter__()

        def __exit__(self, *exc):
            return self._context.__exit__(*exc)

    ns["StreamContext"] = StreamContext

    # --- BACKEND: memory --------------------------------------------------------------
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved",
                 "max_memory_reserved", "memory_stats", "mem_get_info"):
        ns[name] = _device_query(name, getattr(backend, name), idx)
    ns["reset_peak_memory_stats"] = _device_query(
        "reset_peak_memory_stats", backend.reset_peak_memory_stats, idx)
    # deprecated aliases keep their old meaning
    ns["memory_cached"] = _device_query("memory_cached", backend.memory_reserved, idx)
    ns["max_memory_cached"] = _device_query("max_memory_cached", backend.max_memory_reserved, idx)
    ns["reset_max_memory_allocated"] = _device_query(
        "reset_max_memory_allocated", backend.reset_peak_memory_stats, idx)
    ns["reset_max_memory_cached"] = _device_query(
        "reset_max_memory_cached", backend.reset_peak_memory_stats, idx)
    ns["device_memory_used"] = _device_query("device_memory_used", backend.memory_allocated, idx)

    @export
    def reset_accumulated_memory_stats(device=None) -> None:
        idx(device)                    # no accumulated counters are kept on this target

    @export
    def memory_stats_as_nested_dict(device=None) -> dict:
        nested: dict = {}
        for key, value in backend.memory_stats(idx(device)).items():
            node = nested
            *path, leaf = key.split(".")
            for part in path:
                node = node.setdefault(part, {})
            node[leaf] = value
        return nested

    @export
    def memory_summary(device=None, abbreviated=False) -> str:
        index = idx(device)
        mib = 2 ** 20
        return (f"|  cudashim memory summary, {backend.name} backend, device {index or 0}\n"
                f"|  allocated: {backend.memory_allocated(index) / mib:.1f} MiB current, "
                f"{backend.max_memory_allocated(index) / mib:.1f} MiB peak\n"
                f"|  reserved:  {backend.memory_reserved(index) / mib:.1f} MiB current, "
                f"{backend.max_memory_reserved(index) / mib:.1f} MiB peak\n")

    @export
    def memory_snapshot(mempool_id=None) -> list:
        return []                      # no allocator segments exist to list on this target

    @export
    def memory_usage(device=None) -> int:
        free, total = backend.mem_get_info(idx(device))
        return int(round(100 * (total - free) / total)) if total else 0

    @export
    def list_gpu_processes(device=None) -> str:
        index = idx(device) or 0
        return (f"{backend.name}:{index}\nprocess {os.getpid():>10d} uses "
                f"{backend.memory_allocated(index) / 2 ** 20:12.3f} MB")

    fraction = {}

    @export
    def set_per_process_memory_fraction(fraction_value, device=None) -> None:
        if not isinstance(fraction_value, float) and not isinstance(fraction_value, int):
            raise TypeError("Invalid type for fraction argument, must be `float`")
        if not 0 <= fraction_value <= 1:
            raise ValueError(f"Invalid fraction value: {fraction_value}. Allowed range: 0~1")
        fraction[idx(device) or 0] = float(fraction_value)

    @export
    def get_per_process_memory_fraction(device=None) -> float:
        return fraction.get(idx(device) or 0, 1.0)

    @export
    def get_allocator_backend() -> str:
        return "native"

    @export
    def ipc_collect() -> None:
        pass

    @export
    def can_device_access_peer(device, peer_device) -> bool:
        first, second = idx(device, optional=False), idx(peer_device, optional=False)
        count = backend.device_count()
        return 0 <= first < count and 0 <= second < count and first != second

    @export
    def host_memory_stats() -> dict:
        return {}                      # no pinned host allocator runs on this target

    @export
    def host_memory_stats_as_nested_dict() -> dict:
        return {}

    @export
    def reset_peak_host_memory_stats() -> None:
        pass

    @export
    def reset_accumulated_host_memory_stats() -> None:
        pass

    # --- SHIM: state, capabilities and feature checks ---------------------------------
    real_cuda = _state.real(torch, "cuda")

    # torch's own modules reach the real functions instead of these (proxy/module.py).
    @export
    def is_available() -> bool:
        if settings.is_honest("is_available"):
            return real_cuda.is_available()
        return backend.device_count() > 0

    @export
    def is_initialized() -> bool:
        return True

    @export
    def init() -> None:
        pass

    @export
    def get_arch_list() -> list:
        major, minor = backend.get_device_capability(None)
        return [f"sm_{major}{minor}"]

    @export
    def get_gencode_flags() -> str:
        return ""

    @export
    def is_tf32_supported() -> bool:
        return False                   # TF32 is an NVIDIA tensor-core format

    ns["has_half"] = True
    ns["has_magma"] = False

    @export
    def get_sync_debug_mode() -> int:
        return 0

    @export
    def set_sync_debug_mode(debug_mode) -> None:
        if debug_mode not in (0, 1, 2, "default", "warn", "error"):
            raise RuntimeError("invalid value of debug_mode, expected one of `default`, `warn`, `error`")

    @export
    def is_current_stream_capturing() -> bool:
        return False

    @export
    def make_graphed_callables(callables, sample_args, num_warmup_iters=3,
                               allow_unused_input=False, pool=None):
        # Without CUDA graphs the callables run eagerly, which computes the same values.
        warn_once("make_graphed_callables",
                  f"torch.cuda.make_graphed_callables: the '{backend.name}' backend has no CUDA "
                  "graphs; the callables run eagerly")
        return callables

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

    ns["device"] = device

    @export
    def device_of(obj):
        if isinstance(obj, torch.Tensor) and obj.device.type == backend.device_type:
            return device(obj.device.index)
        return device(-1)

    ns.update(_legacy_classes(backend))
    return ns


def _device_query(name, method, idx):
    def query(device=None):
        return method(idx(device))
    query.__name__ = query.__qualname__ = name
    return query


class _LegacyTypeMeta(type):
    """``isinstance(t, torch.cuda.FloatTensor)``: a float32 tensor on the target."""

    def __instancecheck__(cls, obj):
        return (isinstance(obj, torch.Tensor) and obj.dtype == cls.dtype
                and obj.device.type == cls.target_type)


def _legacy_classes(backend) -> dict:
    target = backend.target_device(None)
    classes = {}
    for prefix, dtype in LEGACY_DTYPES.items():
        if not prefix.startswith("Complex"):
            def make_tensor(cls, *args, _dtype=dtype, **kwargs):
                legacy = torch.empty(0, dtype=_dtype).new(*args, **kwargs)
                return legacy.to(target)
            name = f"{prefix}Tensor"
            classes[name] = _LegacyTypeMeta(name, (), {
                "__new__": make_tensor, "dtype": dtype, "target_type": backend.device_type,
                "_cudashim_legacy_name": f"torch.cuda.{name}", "__module__": "torch.cuda"})

        def make_storage(cls, *args, _dtype=dtype, **kwargs):
            return torch.TypedStorage(*args, dtype=_dtype, device=target, **kwargs)
        name = f"{prefix}Storage"
        classes[name] = type(name, (), {"__new__": make_storage, "__module__": "torch.cuda"})
    return classes


def _amp(backend) -> dict:
    """``torch.cuda.amp``: the CUDA spellings of torch.amp, on the target."""

    class autocast(torch.amp.autocast):
        """``torch.cuda.amp.autocast``: autocast on the target device."""

        def __init__(self, enabled: bool = True, dtype=torch.float16, cache_enabled: bool = True):
            # "cuda" is translated by the patched torch.amp.autocast.__init__.
            super().__init__("cuda", dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)

    class GradScaler(torch.amp.GradScaler):
        """``torch.cuda.amp.GradScaler``: gradient scaling on the target device."""

        def __init__(self, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                     backoff_factor: float = 0.5, growth_interval: int = 2000,
                     enabled: bool = True):
            super().__init__("cuda", init_scale=init_scale, growth_factor=growth_factor,
                             backoff_factor=backoff_factor, growth_interval=growth_interval,
                             enabled=enabled)

    for cls in (autocast, GradScaler):
        cls.__module__ = "torch.cuda.amp"
        cls.__qualname__ = cls.__name__

    def custom_fwd(fwd=None, *, cast_inputs=None):
        return torch.amp.custom_fwd(fwd, device_type="cuda", cast_inputs=cast_inputs)

    def custom_bwd(bwd=None):
        return torch.amp.custom_bwd(bwd, device_type="cuda")

    def amp_definitely_not_available() -> bool:
        return backend.device_count() == 0

    return {"autocast": autocast, "GradScaler": GradScaler, "custom_fwd": custom_fwd,
            "custom_bwd": custom_bwd, "amp_definitely_not_available": amp_definitely_not_available}
