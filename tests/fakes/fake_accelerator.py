"""A fake accelerator that PyTorch itself believes is a device, for tests only.

PyTorch's PrivateUse1 dispatch key is renamed (to ``npu``, ``hpu``, ``musa``, ...) and
given a device module, hooks and a device guard, so ``torch.accelerator`` reports it.
Tensors on it are ``DeviceTensor``: a ``__torch_dispatch__`` wrapper subclass whose
``device`` is the fake device and which holds a CPU tensor; every aten op runs on the
inner CPU tensors. Factories without tensor arguments reach the PrivateUse1 key instead of
Python, so they get kernels registered with ``torch.library``.

Renaming PrivateUse1 is once per process: install only in forked test processes.
Limits (torch 2.13): one device, no ``torch.Generator(device=<fake>)``, ~10 us per op.
"""

from __future__ import annotations

import threading
import time
import types
import weakref

import torch

_installed_name = None
_libraries = []              # torch.library handles must stay alive


# --- tensors ---------------------------------------------------------------------------
class DeviceTensor(torch.Tensor):
    """A tensor on the fake device, backed by a CPU tensor."""

    @staticmethod
    def __new__(cls, inner: torch.Tensor):
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls, inner.size(), strides=inner.stride(), storage_offset=inner.storage_offset(),
            dtype=inner.dtype, device=torch.device(_installed_name, 0),
            requires_grad=inner.requires_grad)
        wrapper.inner = inner
        return wrapper

    __torch_function__ = torch._C._disabled_torch_function_impl

    def __repr__(self, *, tensor_contents=None):
        text = repr(self.inner)
        suffix = f", device='{_installed_name}:0'"
        return text[:-1] + suffix + ")" if text.endswith(")") else text

    def tolist(self):
        return self.inner.tolist()

    def __reduce_ex__(self, protocol):
        # Pickling (torch.save, multiprocessing) goes through the CPU copy.
        return (_rebuild_on_device, (self.detach().inner.clone(),))

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        wrappers = {}
        cpu_args = _unwrap(args, wrappers)
        cpu_kwargs = _unwrap(kwargs, wrappers)
        leaves_device = _moves_to_cpu(kwargs)
        result = func(*cpu_args, **cpu_kwargs)
        if leaves_device:
            return result
        return _wrap(result, wrappers)


def _rebuild_on_device(inner):
    return DeviceTensor(inner)


def _is_fake_device(value) -> bool:
    return isinstance(value, torch.device) and value.type == _installed_name


def _unwrap(value, wrappers):
    if isinstance(value, DeviceTensor):
        wrappers[id(value.inner)] = value
        return value.inner
    if _is_fake_device(value):
        return torch.device("cpu")
    if isinstance(value, (list, tuple)):
        items = [_unwrap(v, wrappers) for v in value]
        return type(value)(items) if isinstance(value, list) else tuple(items)
    if isinstance(value, dict):
        return {k: _unwrap(v, wrappers) for k, v in value.items()}
    return value


def _moves_to_cpu(kwargs) -> bool:
    device = kwargs.get("device")
    return isinstance(device, torch.device) and device.type == "cpu"


def _wrap(value, wrappers):
    if isinstance(value, torch.Tensor) and not isinstance(value, DeviceTensor):
        existing = wrappers.get(id(value))
        if existing is not None:
            return existing           # an in-place or out= op returns its argument
        memory.track(value)
        return DeviceTensor(value)
    if isinstance(value, (list, tuple)):
        items = [_wrap(v, wrappers) for v in value]
        return type(value)(items) if isinstance(value, list) else tuple(items)
    return value


# --- factories reaching the PrivateUse1 key -------------------------------------------
_FACTORIES = (
    "empty.memory_format", "empty_strided", "arange", "arange.start", "arange.start_step",
    "linspace", "logspace", "eye", "eye.m", "randperm", "randperm.generator",
    "scalar_tensor", "full", "zeros", "ones",
)


def _factory_kernel(op):
    def kernel(*args, **kwargs):
        kwargs["device"] = torch.device("cpu")
        kwargs.pop("pin_memory", None)
        inner = op(*args, **kwargs)
        memory.track(inner)
        return DeviceTensor(inner)
    return kernel


def _copy_from(self, dst, non_blocking=False):
    source = self.inner if isinstance(self, DeviceTensor) else self
    target = dst.inner if isinstance(dst, DeviceTensor) else dst
    target.copy_(source)
    return dst


def _register_kernels():
    lib = torch.library.Library("aten", "IMPL")
    for name in _FACTORIES:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        lib.impl(name, _factory_kernel(op), "PrivateUse1")
    lib.impl("_copy_from", _copy_from, "PrivateUse1")
    # torch.autocast(<fake>) consults this key for every op: let them all through.
    _libraries.append(lib)
    everything = torch.library.Library("_", "IMPL")
    everything.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")
    _libraries.append(everything)


# --- memory statistics: the live CPU storages behind fake tensors --------------------
class _Memory:
    """Bytes of the CPU storages first created for fake tensors, released with that tensor
    (views share the storage and are not counted twice; a view outliving its base is not
    counted, which is precise enough for statistics)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.by_pointer = {}
        self.allocated = 0
        self.peak = 0

    def track(self, inner: torch.Tensor) -> None:
        storage = inner.untyped_storage()
        pointer, nbytes = storage.data_ptr(), storage.nbytes()
        with self.lock:
            if pointer in self.by_pointer or nbytes == 0:
                return
            self.by_pointer[pointer] = nbytes
            self.allocated += nbytes
            self.peak = max(self.peak, self.allocated)
        weakref.finalize(inner, self._release, pointer)

    def _release(self, pointer) -> None:
        with self.lock:
            self.allocated -= self.by_pointer.pop(pointer, 0)

    def reset_peak(self) -> None:
        with self.lock:
            self.peak = self.allocated


memory = _Memory()


# --- streams, events, the device module ---------------------------------------------
class Event:
    def __init__(self, enable_timing=False, blocking=False, interprocess=False):
        self.enable_timing = enable_timing
        self.recorded_ns = None

    def record(self, stream=None):
        self.recorded_ns = time.perf_counter_ns()

    def query(self):
        return True

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def elapsed_time(self, end):
        return (end.recorded_ns - self.recorded_ns) / 1e6


class Stream:
    def __init__(self, device=None, priority=0, **kwargs):
        self.device = torch.device(device if device is not None else _installed_name, 0)
        self.priority = priority

    def query(self):
        return True

    def synchronize(self):
        pass

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event


class _StreamContext:
    def __init__(self, device_module, stream):
        self.module, self.stream = device_module, stream

    def __enter__(self):
        self.previous = self.module.current_stream()
        self.module.set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        self.module.set_stream(self.previous)


def build_device_module(name: str) -> types.ModuleType:
    """A device module mirroring the parts of torch.cuda vendors mirror; ``calls`` lists
    the functions a caller reached."""
    mod = types.ModuleType(f"torch.{name}")
    state = {"device": 0, "stream": None}
    calls = []                                     # what the vendor module was asked
    default_streams = []

    def recorded(fn):
        def call(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs)
        call.__name__ = fn.__name__
        return call

    def check(index):
        index = _index(index)
        if index not in (0, None):
            raise RuntimeError(f"fake {name}: invalid device ordinal {index}")
        return 0

    def _index(device):
        if device is None:
            return None
        if isinstance(device, (str, torch.device)):
            return torch.device(device).index or 0
        return int(device)

    def is_available():
        return True

    def device_count():
        return 1

    def current_device():
        return state["device"]

    def set_device(device):
        state["device"] = check(device)

    def synchronize(device=None):
        check(device)

    def _is_in_bad_fork():
        return False

    def manual_seed(seed):
        torch.default_generator.manual_seed(int(seed))

    def seed():
        torch.default_generator.seed()

    def initial_seed():
        return torch.default_generator.initial_seed()

    def get_rng_state(device=None):
        return torch.default_generator.get_state()

    def set_rng_state(new_state, device=None):
        torch.default_generator.set_state(new_state)

    def get_amp_supported_dtype():
        return [torch.float16, torch.bfloat16]

    def is_bf16_supported(including_emulation=True):
        return True

    def get_device_name(device=None):
        check(device)
        return f"Fake {name.upper()}"

    def get_device_properties(device=None):
        check(device)
        return types.SimpleNamespace(name=get_device_name(), total_memory=16 * 2**30,
                                     multi_processor_count=8)

    def memory_allocated(device=None):
        return memory.allocated

    def max_memory_allocated(device=None):
        return memory.peak

    def reset_peak_memory_stats(device=None):
        memory.reset_peak()

    def memory_stats(device=None):
        return {"allocated_bytes.all.current": memory.allocated,
                "allocated_bytes.all.peak": memory.peak}

    def mem_get_info(device=None):
        total = 16 * 2**30
        return total - memory.allocated, total

    def empty_cache():
        pass

    def default_stream(device=None):
        if default_streams:
            return default_streams[0]
        default_streams.append(Stream(name))
        return default_streams[0]

    def current_stream(device=None):
        return state["stream"] or default_stream()

    def set_stream(stream):
        state["stream"] = stream

    def stream(stream):
        return _StreamContext(mod, stream)

    functions = [is_available, device_count, current_device, set_device, synchronize,
                 _is_in_bad_fork, manual_seed, seed, initial_seed, get_rng_state, set_rng_state,
                 get_amp_supported_dtype, is_bf16_supported, get_device_name,
                 get_device_properties, memory_allocated, max_memory_allocated,
                 reset_peak_memory_stats, memory_stats, mem_get_info, empty_cache,
                 current_stream, default_stream, set_stream, stream]
    for fn in functions:
        setattr(mod, fn.__name__, recorded(fn))
    mod.manual_seed_all = recorded(manual_seed)
    mod.manual_seed_all.__name__ = "manual_seed_all"
    mod.seed_all = mod.seed
    mod.memory_reserved = mod.memory_allocated
    mod.max_memory_reserved = mod.max_memory_allocated
    mod.default_generators = (torch.default_generator,)
    mod.Event, mod.Stream = Event, Stream
    mod.calls = calls
    return mod


module = None


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self):
        return True

    def is_built(self):
        return True

    def has_primary_context(self, device_index):
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def install(name: str = "npu") -> types.ModuleType:
    """Make ``name`` a device of this process; return its device module (torch.<name>)."""
    global _installed_name, module
    if _installed_name is not None:
        if _installed_name != name:
            raise RuntimeError(f"a fake accelerator '{_installed_name}' is already installed")
        return module
    _installed_name = name
    module = build_device_module(name)
    torch.utils.backend_registration._setup_privateuseone_for_python_backend(
        rename=name, backend_module=module, hook=_Hooks(), device_guard=_Guard())
    _register_kernels()
    _patch_pinning()
    _register_serialization(name)
    return module


def _patch_pinning():
    # With an accelerator present, CPU tensors pin for it; the fake has no pinned memory,
    # so pinning is the identity, as on a device with unified memory.
    torch.Tensor.is_pinned = lambda self, device=None: False
    torch.Tensor.pin_memory = lambda self, device=None: self


def _register_serialization(name):
    # Fake tensors pickle as their CPU tensor plus a rebuild on the device. Storages tagged
    # with the fake device stay on the CPU while unpickling: allocating a storage on the
    # PrivateUse1 key would crash, there being no allocator behind it.
    torch.serialization.add_safe_globals([_rebuild_on_device])

    def tag(storage):
        return None

    def keep_on_host(storage, location):
        return storage if location.startswith(name) else None

    torch.serialization.register_package(1, tag, keep_on_host)


def register_collective(name: str, device_type: str = None) -> None:
    """Register ``name`` as a torch.distributed backend for the fake device, run by gloo."""
    import torch.distributed as dist
    device_type = device_type or _installed_name

    def create(store, rank, size, timeout):
        return dist.ProcessGroupGloo(store, rank, size, timeout)

    if name not in dist.Backend.backend_list:
        dist.Backend.register_backend(name, create, devices=["cpu", device_type])
