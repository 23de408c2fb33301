"""Apple GPUs through ``torch.mps``: one device, no streams of its own, gloo collectives.

MPS keeps no peak-memory counter, so the peak figures are the current ones; it has one
command queue, so streams are host-side handles on it (see ``host.py``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from ..errors import invalid_device_ordinal
from .base import Backend
from .host import DeviceProperties, HostStream, HostStreams


class MPSStream(HostStream):
    """MPS's one command queue, as a CUDA-style stream."""
    device_type = "mps"


class MPSBackend(HostStreams, Backend):
    name = "mps"
    detection_rank = 40
    device_type = "mps"
    deepspeed_accelerator = "mps"
    default_collective = "gloo"
    device_hint = "MPS needs Apple silicon, macOS 12.3 or later and a torch built with MPS"

    @classmethod
    def device_absent_reason(cls) -> Optional[str]:
        if not torch.backends.mps.is_available():
            built = "built" if torch.backends.mps.is_built() else "not built"
            return f"no MPS device: torch.backends.mps.is_available() is False (this torch is " \
                   f"{built} with MPS; {cls.device_hint})"
        return None

    # --- devices: exactly one ---------------------------------------------------------
    def device_count(self) -> int:
        return 1

    def current_device(self) -> int:
        return 0

    def set_device(self, index: int) -> None:
        if index != 0:
            raise invalid_device_ordinal(index, 1, "MPS")

    def synchronize(self, index: Optional[int] = None) -> None:
        self.module.synchronize()

    def get_device_name(self, index: Optional[int] = None) -> str:
        return "Apple GPU (MPS)"

    def get_device_properties(self, index: Optional[int] = None) -> DeviceProperties:
        major, minor = self.get_device_capability(index)
        return DeviceProperties(name=self.get_device_name(), total_memory=self.module.recommended_max_memory(),
                                major=major, minor=minor, multi_processor_count=1)

    def is_bf16_supported(self, including_emulation: bool = True) -> bool:
        return torch.backends.mps.is_macos_or_newer(14, 0)

    # --- RNG: torch.mps seeds its one generator ---------------------------------------
    def manual_seed(self, seed: int) -> None:
        self.module.manual_seed(seed)

    manual_seed_all = manual_seed

    def seed(self) -> None:
        self.module.seed()

    seed_all = seed

    def initial_seed(self) -> int:
        return self.default_generator(0).initial_seed()

    def get_rng_state(self, index: Optional[int] = None) -> "torch.Tensor":
        return self.module.get_rng_state()

    def set_rng_state(self, new_state, index: Optional[int] = None) -> None:
        self.module.set_rng_state(new_state)

    def default_generator(self, index: int) -> "torch.Generator":
        return torch.mps._get_default_mps_generator()

    # --- streams and events: one queue, and MPS's own events ---------------------------
    Stream = MPSStream

    @property
    def Event(self):
        return self.module.Event

    # --- memory -----------------------------------------------------------------------
    def memory_allocated(self, index: Optional[int] = None) -> int:
        return self.module.current_allocated_memory()

    max_memory_allocated = memory_allocated

    def memory_reserved(self, index: Optional[int] = None) -> int:
        return self.module.driver_allocated_memory()

    max_memory_reserved = memory_reserved

    def reset_peak_memory_stats(self, index: Optional[int] = None) -> None:
        pass

    def memory_stats(self, index: Optional[int] = None) -> dict:
        allocated, reserved = self.memory_allocated(), self.memory_reserved()
        return {"allocated_bytes.all.current": allocated, "allocated_bytes.all.peak": allocated,
                "reserved_bytes.all.current": reserved, "reserved_bytes.all.peak": reserved}

    def mem_get_info(self, index: Optional[int] = None) -> Tuple[int, int]:
        total = self.module.recommended_max_memory()
        return max(total - self.memory_reserved(), 0), total

    # --- dtypes and communication -----------------------------------------------------
    def autocast_dtypes(self):
        return (torch.float16, torch.bfloat16)

    def process_group_backend(self) -> str:
        return self.collective
