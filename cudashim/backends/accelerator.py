"""Any accelerator registered with ``torch.accelerator`` that has no backend of its own.

Cambricon MLU, Moore Threads MUSA, Biren SUPA, ...: the vendor's torch extension renames
PrivateUse1 and registers ``torch.<type>``; torch loads such extensions itself when they
declare a ``torch.backends`` entry point. This backend reads only ``torch.accelerator``
and ``torch.get_device_module()``, so a new vendor needs no cudashim code. Where the
device module has a function it is used; otherwise the device-generic ``torch.accelerator``
one is. The collective library is the one the vendor registered for its device type with
``torch.distributed.Backend.register_backend``, or the ``collective`` setting; a device with
none gets collectives staged through host memory to gloo (``staged.py``).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import warnings
from typing import Optional, Tuple

import torch

from .. import torch_names
from ..errors import invalid_device_ordinal, warn_once
from ..job_layout import local_world_size
from . import host, staged
from .base import Backend, vendor_lookup
from .host import DeviceProperties

# torch.accelerator's names where they differ from torch.cuda's.
ACCELERATOR_NAMES = {"current_device": "current_device_index", "set_device": "set_device_index",
                     "mem_get_info": "get_memory_info"}

# torch.cuda's memory figures, as torch.cuda.memory_stats() names them.
MEMORY_STATS_KEYS = {"memory_allocated": "allocated_bytes.all.current",
                     "max_memory_allocated": "allocated_bytes.all.peak",
                     "memory_reserved": "reserved_bytes.all.current",
                     "max_memory_reserved": "reserved_bytes.all.peak"}

# The fields of torch.cuda.get_device_properties() that CUDA programs read.
CUDA_PROPERTIES = ("name", "total_memory", "major", "minor", "multi_processor_count")


class AcceleratorBackend(Backend):
    name = "accelerator"
    detection_rank = 90
    device_type = "privateuseone"              # replaced by the real type when built
    profiler_activity = "PrivateUse1"
    honours_device_count = True
    device_hint = ("install and import the vendor's torch extension; extensions with a "
                   "'torch.backends' entry point load with torch")

    @staticmethod
    def accelerator_type() -> Optional[str]:
        current_accelerator = torch_names.get("torch.accelerator.current_accelerator", None)
        if current_accelerator is None:
            # torch before 2.6: the out-of-tree device a vendor's extension registered, by the
            # name it gave PrivateUse1, where it registered a device module under that name.
            name = torch._C._get_privateuse1_backend_name()
            return name if name != "privateuseone" and hasattr(torch, name) else None
        accelerator = current_accelerator()
        return None if accelerator is None else accelerator.type

    @classmethod
    def absent_reason(cls) -> Optional[str]:
        # Device types another backend owns are left to it by the backend table.
        if cls.accelerator_type() is None:
            return f"torch.accelerator reports no accelerator ({cls.device_hint})"
        return None

    def __init__(self, settings):
        self.device_type = self.accelerator_type()
        super().__init__(settings)
        # What the vendor's module has before cudashim gives it torch.cuda's other names
        # (the device_module group): those additions answer through this backend.
        self._vendor_names = frozenset(dir(self.module))
        self._peaks_read: dict = {}            # real index -> {peak name: highest read}
        self._has_device_allocator: Optional[bool] = None
        self._current = host.CurrentStream()        # used where the device has no streams
        self._default_host_stream = None
        self._real_count = self._either("device_count")
        self._count = self._resolve_count(settings, self._real_count)
        self.shares_devices = self._count > self._real_count
        self._current_index = contextvars.ContextVar("cudashim_shared_device", default=None)
        # A device whose kernels are the host CPU's says so in its module (the test
        # accelerator's run torch's CPU kernels on its memory): its dtypes are as fast as the
        # host's, and its long reductions as inexact.
        self.computes_with_host_kernels = self._vendor("computes_with_host_kernels") is True

    @staticmethod
    def _resolve_count(settings, real: int) -> int:
        """How many CUDA devices the program sees: the real ones, unless the setting asks
        for more, or a launcher starts more local ranks than there are devices (each rank
        then calls set_device(local_rank)); then CUDA index i is real device i mod count."""
        if settings.device_count is not None:
            return settings.device_count
        local_world = local_world_size()
        if local_world is not None and local_world > real:
            warn_once("shared-devices", f"{local_world} local ranks share {real} device(s) of "
                                        f"type '{AcceleratorBackend.accelerator_type()}'")
            return int(local_world)
        return real

    def _vendor(self, name):
        """The device module's ``name`` (an attribute, or a name its ``__getattr__`` makes),
        or None when the vendor does not provide it."""
        if name in self._vendor_names:
            return getattr(self.module, name, None)
        return vendor_lookup(self.module, name)

    def describe(self) -> str:
        return f"{self.name} '{self.device_type}' " + super().describe().split(" ", 1)[1]

    def _either(self, name, *args):
        """The device module's ``name`` when it has one, else torch.accelerator's twin."""
        own = self._vendor(name)
        if own is None:
            own = getattr(torch.accelerator, ACCELERATOR_NAMES.get(name, name))
        return own(*args)

    # --- devices: the real ones, or more CUDA indices sharing them ---------------------
    def device_count(self) -> int:
        return self._count

    def target_device(self, index: Optional[int]) -> "torch.device":
        if index is not None and self.shares_devices:
            index %= self._real_count
        return super().target_device(index)

    def check_index(self, index: int) -> None:
        if not 0 <= index < self._count:
            raise invalid_device_ordinal(
                index, self._count, f"the '{self.device_type}' target",
                f"run with {self.settings.spelled('device_count', 'N')} for N CUDA devices "
                "sharing them")

    def _real(self, index: Optional[int]) -> Optional[int]:
        """The real device index a CUDA index stands for (None stays None: the current)."""
        return index % self._real_count if index is not None and self.shares_devices else index

    def current_device(self) -> int:
        shared = self._current_index.get() if self.shares_devices else None
        return self._either("current_device") if shared is None else shared

    def set_device(self, index: int) -> None:
        self.check_index(index)
        if self.shares_devices:
            self._current_index.set(index)
            index %= self._real_count
        self._either("set_device", index)

    def synchronize(self, index: Optional[int] = None) -> None:
        self._either("synchronize", self._real(index))

    def get_device_name(self, index: Optional[int] = None) -> str:
        own = self._vendor("get_device_name")
        return own(self._real(index)) if own else f"{self.device_type}:{self.current_device() if index is None else index}"

    def get_device_properties(self, index: Optional[int] = None):
        """The vendor's properties where they carry the fields CUDA programs read
        (``major``, ``minor``, ``multi_processor_count``, ...); otherwise cudashim's, with
        the vendor's name and memory (torchvulkan's have neither capability nor SM count)."""
        own = self._vendor("get_device_properties")
        properties = own(self._real(index)) if own else None
        if properties is not None and all(hasattr(properties, field) for field in CUDA_PROPERTIES):
            return properties
        major, minor = self.get_device_capability(index)
        return DeviceProperties(
            name=getattr(properties, "name", None) or self.get_device_name(index),
            total_memory=getattr(properties, "total_memory", None) or self.mem_get_info(index)[1],
            major=major, minor=minor, multi_processor_count=1)

    def dtype_speeds(self):
        if not self.computes_with_host_kernels:
            return super().dtype_speeds()
        from . import cpu_speed
        fast, how_known = cpu_speed.speeds(self.settings.host_profile)
        return fast, f"the device computes with the host CPU's kernels: {how_known}"

    def float16_matmul_choices(self):
        if not self.computes_with_host_kernels:
            return super().float16_matmul_choices()
        from . import cpu_speed
        return cpu_speed.matmul_choices(self.settings.host_profile)

    def float16_op_choices(self):
        if not self.computes_with_host_kernels:
            return super().float16_op_choices()
        from . import cpu_speed
        return cpu_speed.op_choices(self.settings.host_profile)

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        """As CUDA answers: True where the device computes bfloat16 natively; else, with
        emulation counted (CUDA's default, which the Hugging Face Trainer's ``--bf16`` gate
        asks with), whether bfloat16 tensors can live on the device and be computed with.
        torchvulkan's ops run them through its own host fallback; autocast regions the
        precision policy runs in float32 (``cudashim doctor`` says how each dtype runs)."""
        own = self._vendor("is_bf16_supported")
        native = bool(own()) if own else torch.bfloat16 in self.autocast_dtypes()
        if native or not including_emulation:
            return native
        return self._holds_bfloat16

    @functools.cached_property
    def _holds_bfloat16(self) -> bool:
        """One bfloat16 sum on the device, as CUDA's check makes one tensor (its fallback
        warnings are the vendor's to give when the program computes, not at this probe)."""
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                ones = torch.ones(2, dtype=torch.bfloat16, device=self.target_device(None))
                return (ones + ones).sum().item() == 4
        except Exception:                  # the device refuses the dtype: no emulation either
            return False

    # --- RNG: the device module's, else the host generator ----------------------------
    def _rng(self, name, host):
        return self._vendor(name) or host

    def manual_seed(self, seed: int) -> None:
        self._rng("manual_seed", torch.default_generator.manual_seed)(int(seed))

    def manual_seed_all(self, seed: int) -> None:
        self._rng("manual_seed_all", torch.default_generator.manual_seed)(int(seed))

    def seed(self) -> None:
        self._rng("seed", torch.default_generator.seed)()

    def seed_all(self) -> None:
        self._rng("seed_all", torch.default_generator.seed)()

    def initial_seed(self) -> int:
        return self._rng("initial_seed", torch.default_generator.initial_seed)()

    def get_rng_state(self, index: Optional[int] = None) -> "torch.Tensor":
        own = self._vendor("get_rng_state")
        return own(self.target_device(index)) if own else torch.default_generator.get_state()

    def set_rng_state(self, new_state, index: Optional[int] = None) -> None:
        own = self._vendor("set_rng_state")
        if own:
            own(new_state, self.target_device(index))
        else:
            torch.default_generator.set_state(new_state)

    def default_generator(self, index: int) -> "torch.Generator":
        generators = self._vendor("default_generators")
        return generators[self._real(index)] if generators else torch.default_generator

    @functools.cached_property
    def _pins_memory(self) -> bool:
        """Whether host memory pins for this device: torch before 2.5 pins for CUDA alone
        (an out-of-tree device's pinning hooks came with 2.5), and some extensions have none."""
        import warnings
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")      # naming the device is deprecated in 2.13
                return torch.empty(1).pin_memory(self.device_type).is_pinned(self.device_type)
        except (RuntimeError, NotImplementedError):
            return False

    def can_pin_memory(self) -> bool:
        return self._pins_memory

    # --- streams and events: the extension's or torch's device-generic classes; cudashim's
    # host-ordered ones (host.py) where the extension has none (torchvulkan) ------------
    @functools.cached_property
    def _host_streams(self):
        """(Stream, Event) of host.py's kind when the device cannot record an event of its
        own or make a stream, else None."""
        own_event, own_stream, device = self._vendor("Event"), self._vendor("Stream"), \
            self.target_device(None)
        try:                                       # the device module's classes: CUDA's signature
            (own_event() if own_event else torch.Event(device=device)).record()
            own_stream() if own_stream else torch.Stream(device=device)
            host.count_as_torch_streams(own_stream or torch.Stream, own_event or torch.Event)
            return None
        except RuntimeError:                       # "Backend doesn't support events."
            return host.host_ordered(self.device_type)

    @property
    def Stream(self):
        return self._host_streams[0] if self._host_streams else self._vendor("Stream") or torch.Stream

    @property
    def Event(self):
        return self._host_streams[1] if self._host_streams else self._vendor("Event") or torch.Event

    def current_stream(self, index: Optional[int] = None):
        if self._host_streams:
            return self._current.stream or self.default_stream(index)
        return self._either("current_stream", self._real(index))

    def default_stream(self, index: Optional[int] = None):
        if self._host_streams:
            if self._default_host_stream is None:
                self._default_host_stream = self.Stream()
            return self._default_host_stream
        own = self._vendor("default_stream")
        return own(self._real(index)) if own else self.current_stream(index)

    def set_stream(self, stream) -> None:
        if self._host_streams:
            self._current.stream = stream
        else:
            self._either("set_stream", stream)

    @contextlib.contextmanager
    def stream(self, stream):
        previous = self._current.stream if self._host_streams else self.current_stream()
        self.set_stream(stream)
        try:
            yield stream
        finally:
            self.set_stream(previous)

    # --- memory: the device module's statistics, else torch.accelerator's -------------
    # A figure neither keeps (torchvulkan keeps no reserved peak, and its allocator is no
    # DeviceAllocator for torch.accelerator to ask) comes from the vendor's memory_stats, else
    # from the figures it has: a peak is then the highest current figure read since the last
    # reset, and never below the allocated peak.
    def memory_allocated(self, index: Optional[int] = None) -> int:
        return self._memory_figure("memory_allocated", index)

    def max_memory_allocated(self, index: Optional[int] = None) -> int:
        return self._memory_figure("max_memory_allocated", index)

    def memory_reserved(self, index: Optional[int] = None) -> int:
        return self._memory_figure("memory_reserved", index)

    def max_memory_reserved(self, index: Optional[int] = None) -> int:
        return self._memory_figure("max_memory_reserved", index)

    def reset_peak_memory_stats(self, index: Optional[int] = None) -> None:
        self._peaks_read.pop(self._real(index), None)
        self._either("reset_peak_memory_stats", self._real(index))

    def memory_stats(self, index: Optional[int] = None) -> dict:
        stats = dict(self._either("memory_stats", self._real(index)))
        for name, key in MEMORY_STATS_KEYS.items():
            if key not in stats:
                stats[key] = self._memory_figure(name, index)
        return stats

    def _memory_figure(self, name: str, index: Optional[int]) -> int:
        real = self._real(index)
        own = self._vendor(name)
        if own is not None:
            return self._read_peak(name, real, own(real))
        key = MEMORY_STATS_KEYS[name]
        stats = self._vendor("memory_stats")
        if stats is not None:
            figures = stats(real)
            if key in figures:
                return self._read_peak(name, real, figures[key])
        if self._device_allocator():
            return self._read_peak(name, real, getattr(torch.accelerator, name)(real))
        if name.startswith("max_"):            # the vendor keeps this peak nowhere
            current = self._memory_figure(name[len("max_"):], index)
            floor = self._memory_figure("max_memory_allocated", index) if name == "max_memory_reserved" else 0
            return max(self._peaks_read.get(real, {}).get(name, 0), current, floor)
        raise RuntimeError(
            f"the {self.device_type} device module and torch.accelerator keep no figure for "
            f"torch.cuda.{name}: {self.device_type}'s allocator keeps no statistics")

    def _read_peak(self, name: str, real, value: int) -> int:
        """Remember the highest current figure read, for the peaks a vendor does not keep."""
        if not name.startswith("max_"):
            peaks = self._peaks_read.setdefault(real, {})
            peak = "max_" + name
            if value > peaks.get(peak, 0):
                peaks[peak] = value
        return value

    def _device_allocator(self) -> bool:
        """Whether torch.accelerator's memory figures answer for this device type: its
        allocator is a DeviceAllocator (torch 2.9 and later), which torch asserts."""
        if self._has_device_allocator is None:
            try:
                torch.accelerator.memory_allocated(self._real(None))
                self._has_device_allocator = True
            except (AttributeError, RuntimeError):
                self._has_device_allocator = False
        return self._has_device_allocator

    def mem_get_info(self, index: Optional[int] = None) -> Tuple[int, int]:
        return tuple(self._either("mem_get_info", self._real(index)))

    def empty_cache(self) -> None:
        self._either("empty_cache")

    # --- dtypes and communication -----------------------------------------------------
    def autocast_dtypes(self):
        own = self._vendor("get_amp_supported_dtype")
        return tuple(own()) if own else (torch.bfloat16, torch.float16)

    def choose_collective(self) -> str:
        """The library the vendor registered for its device type; where it registered none,
        collectives staged through host memory to gloo (``staged``)."""
        import torch.distributed as dist
        return dist.Backend.default_device_backend_map.get(self.device_type) or staged.NAME

    def process_group_backend(self) -> str:
        if self.collective == staged.NAME:          # one process group for every device
            return staged.NAME
        return super().process_group_backend()
