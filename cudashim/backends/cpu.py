"""The CPU backend: "cuda" tensors live in host memory, NCCL becomes gloo.

The CPU has no stream, event, RNG-per-device or memory-statistics API of its own that
matches torch.cuda's, so this backend implements them: events are host-timed (CPU ops are
synchronous, so the time an event is recorded is the time the work before it finished),
the RNG calls drive the CPU default generator, and memory statistics count the storages the
program put on the device (``cudashim.device_memory``).
"""

from __future__ import annotations

import contextvars
import functools
import operator
import os
import platform
from typing import Optional, Tuple

import torch

from ..device_memory import DeviceMemory, stats as memory_stats_of
from ..errors import invalid_device_ordinal
from ..job_layout import local_world_size
from .base import Backend
from .host import DeviceProperties, HostStreams


def visible_device_count(value: str) -> int:
    """How many devices a CUDA_VISIBLE_DEVICES value exposes (CUDA stops at the first invalid)."""
    count = 0
    for entry in value.split(","):
        entry = entry.strip()
        if not entry or entry.startswith("-"):
            break
        count += 1
    return count


class CPUBackend(HostStreams, Backend):
    name = "cpu"
    detection_rank = 100
    device_type = "cpu"
    deepspeed_accelerator = "cpu"
    honours_device_count = True
    shares_devices = True                      # every virtual cuda:N is host memory
    device_memory_is_host = True               # moves copy where CUDA's do (residency.py)
    computes_with_host_kernels = True          # long reductions as exact as CUDA's (reductions.py)

    def __init__(self, settings):
        super().__init__(settings)
        self._count = self._resolve_count(settings)
        # The current device, per thread as CUDA's is (a new thread starts at 0). A context
        # variable: read in a C call, a tenth of what a threading.local attribute costs.
        self._current = contextvars.ContextVar("cudashim_cpu_current_device", default=0)
        self._host = torch.device("cpu")
        # Fed by the moves and factories that put tensors on the device (patches/residency.py).
        self.device_memory = DeviceMemory()

    @staticmethod
    def _resolve_count(settings) -> int:
        # Default to one device: more makes libraries wrap models in nn.DataParallel and
        # mp.spawn(nprocs=device_count()) start that many processes. Under torchrun each
        # rank sees one device per local rank, as on a machine with a GPU per process, so
        # torch.cuda.set_device(local_rank) works; so under srun, mpirun and DeepSpeed's launcher.
        if settings.device_count is not None:
            return settings.device_count
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        if visible is not None:
            return visible_device_count(visible)
        return local_world_size() or 1

    # --- devices ----------------------------------------------------------------------
    def device_count(self) -> int:
        return self._count

    def target_device(self, index: Optional[int]) -> "torch.device":
        return self._host                      # every virtual cuda:N is host memory

    def check_index(self, index: int) -> None:
        if not 0 <= index < self._count:
            raise invalid_device_ordinal(
                index, self._count, "cudashim's cpu backend",
                f"run with {self.settings.spelled('device_count', 'N')} or CUDA_VISIBLE_DEVICES "
                "for N virtual devices")

    def current_device(self) -> int:
        return self._current.get()

    def native_answers(self) -> dict:
        # C callables: the context variable's own get, and a partial handing back the count.
        return {"current_device": self._current.get,
                "device_count": functools.partial(operator.index, self._count)}

    def set_device(self, index: int) -> None:
        self.check_index(index)
        self._current.set(index)

    def synchronize(self, index: Optional[int] = None) -> None:
        pass                                   # CPU ops have finished when they return

    def get_device_name(self, index: Optional[int] = None) -> str:
        return _cpu_model_name()

    def get_device_properties(self, index: Optional[int] = None) -> DeviceProperties:
        major, minor = self.get_device_capability(index)
        return DeviceProperties(name=_cpu_model_name(), total_memory=_physical_memory(),
                                major=major, minor=minor,
                                multi_processor_count=os.cpu_count() or 1)

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return True

    # --- RNG: one CPU generator serves every virtual device ----------------------------
    # torch.manual_seed() itself calls torch.cuda.manual_seed_all(), so these must drive
    # the default generator directly or they would recurse.
    def manual_seed(self, seed: int) -> None:
        torch.default_generator.manual_seed(int(seed))

    manual_seed_all = manual_seed

    def seed(self) -> None:
        torch.default_generator.seed()

    seed_all = seed

    def initial_seed(self) -> int:
        return torch.default_generator.initial_seed()

    def get_rng_state(self, index: Optional[int] = None) -> "torch.Tensor":
        return torch.default_generator.get_state()

    def set_rng_state(self, new_state, index: Optional[int] = None) -> None:
        torch.default_generator.set_state(new_state)

    def default_generator(self, index: int) -> "torch.Generator":
        return torch.default_generator

    # --- memory: what the program put on the device -------------------------------------
    # The storages moved or made there, each counted until torch frees it (device_memory.py);
    # every virtual device is one pool of host memory, so each index answers for all of them.
    # Reserved memory is allocated memory: the freed blocks malloc keeps (cudashim.host_memory)
    # are the process's, not counted per device.
    def memory_allocated(self, index: Optional[int] = None) -> int:
        return self.device_memory.allocated

    memory_reserved = memory_allocated

    def max_memory_allocated(self, index: Optional[int] = None) -> int:
        return self.device_memory.peak

    max_memory_reserved = max_memory_allocated

    def reset_peak_memory_stats(self, index: Optional[int] = None) -> None:
        self.device_memory.reset_peak()

    def memory_stats(self, index: Optional[int] = None) -> dict:
        return memory_stats_of(self.device_memory)

    def mem_get_info(self, index: Optional[int] = None) -> Tuple[int, int]:
        info = _meminfo()
        total = info.get("MemTotal", _physical_memory())
        return info.get("MemAvailable", total), total

    def empty_cache(self) -> None:
        from .. import host_memory
        host_memory.release()

    # --- dtypes and kernels -----------------------------------------------------------
    def autocast_dtypes(self):
        return (torch.bfloat16, torch.float16)

    def dtype_speeds(self):
        from . import cpu_speed
        return cpu_speed.speeds(self.settings.host_profile)

    def float16_matmul_choices(self):
        from . import cpu_speed
        return cpu_speed.matmul_choices(self.settings.host_profile)

    def float16_op_choices(self):
        from . import cpu_speed
        return cpu_speed.op_choices(self.settings.host_profile)

    def sdpa_backends(self) -> frozenset:
        from torch.nn.attention import SDPBackend
        return frozenset({SDPBackend.MATH, SDPBackend.FLASH_ATTENTION})

    def can_pin_memory(self) -> bool:
        return False                           # pinned host memory needs an accelerator

    def process_group_backend(self) -> str:
        return self.collective


def _meminfo() -> dict:
    info = {}
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return info


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0


_model_name: Optional[str] = None


def _cpu_model_name() -> str:
    global _model_name
    if _model_name is None:
        name = ""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        name = line.split(":", 1)[1].strip()
                        break
        except OSError:
            pass
        _model_name = name or platform.processor() or platform.machine() or "CPU"
    return _model_name
