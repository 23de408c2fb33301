"""``triton.runtime.driver.active`` for a target Triton has no backend for.

Libraries ask Triton's driver about the device before they launch: the SM count that sizes a
persistent grid (``driver.active.utils.get_device_properties(i)["multiprocessor_count"]``), the
register file and shared memory that bound occupancy, whether the target is CUDA or HIP
(``get_current_target().backend``), the device to put tensors on (``get_active_torch_device()``),
the benchmarker. With no driver active Triton raises "0 active drivers". The driver here answers
for the CUDA device the program sees, from what ``torch.cuda`` tells the program, so that a
library sizes its launches as it would on that device; the limits a CUDA device has and the
target does not report are an A100's (compute capability 8.0, as the target reports).
"""

from __future__ import annotations

import sys

# What an sm_80 device reports where the target has no answer of its own.
WARP_SIZE = 32
MAX_SHARED_MEMORY = 166912           # bytes a block may opt into
MAX_REGISTERS = 65536                # per multiprocessor
SM_CLOCK_KHZ = 1410000
MEMORY_CLOCK_KHZ = 1215000
MEMORY_BUS_BITS = 5120
# triton.testing.do_bench clears this much memory between runs, as it clears L2 on CUDA; a
# host's last-level cache is no larger.
BENCHMARK_CACHE_BYTES = 32 * 2**20


def _cuda():
    """torch.cuda as the program sees it (cudashim's proxy)."""
    return sys.modules["torch"].cuda


class DeviceUtils:
    """``driver.active.utils``: the device queries libraries make."""

    @staticmethod
    def get_device_properties(device) -> dict:
        properties = _cuda().get_device_properties(device)
        return {
            "max_shared_mem": MAX_SHARED_MEMORY,
            "max_num_regs": MAX_REGISTERS,
            "multiprocessor_count": properties.multi_processor_count,
            "warpSize": WARP_SIZE,
            "sm_clock_rate": SM_CLOCK_KHZ,
            "mem_clock_rate": MEMORY_CLOCK_KHZ,
            "mem_bus_width": MEMORY_BUS_BITS,
        }

    @staticmethod
    def get_device_capability(device):
        return _cuda().get_device_capability(device)

    @staticmethod
    def get_current_device() -> int:
        return _cuda().current_device()

    @staticmethod
    def set_current_device(device) -> None:
        _cuda().set_device(device)


class InterpretedDriver:
    """The active driver while launches run through Triton's interpreter."""

    backend = "cuda"
    utils = DeviceUtils()

    @staticmethod
    def is_active() -> bool:
        return True

    def get_current_device(self) -> int:
        return self.utils.get_current_device()

    def set_current_device(self, device) -> None:
        self.utils.set_current_device(device)

    def get_device_capability(self, device=None):
        return self.utils.get_device_capability(device)

    def get_current_stream(self, device=None) -> int:
        return 0                            # launches are synchronous: one stream

    def get_current_target(self):
        from triton.backends.compiler import GPUTarget
        major, minor = self.get_device_capability()
        return GPUTarget(self.backend, major * 10 + minor, WARP_SIZE)

    def get_active_torch_device(self):
        import torch
        return torch.device("cuda", self.get_current_device())

    def get_device_interface(self):
        return _cuda()

    def map_python_to_cpp_type(self, ty: str) -> str:
        raise NotImplementedError("kernels run through Triton's interpreter here: nothing is "
                                  "compiled to C++")

    def get_benchmarker(self):
        from triton.testing import do_bench
        return do_bench

    def get_empty_cache_for_benchmark(self):
        import torch
        return torch.empty(BENCHMARK_CACHE_BYTES, dtype=torch.int8, device="cuda")

    def clear_cache(self, cache) -> None:
        cache.zero_()

    def __repr__(self):
        return "<cudashim's driver: Triton's interpreter, answering as CUDA>"


def install(activation) -> None:
    """Make the interpreted driver Triton's active one, for as long as the activation lives."""
    import importlib
    # The module, not triton.runtime's name "driver", which is the config itself.
    config = importlib.import_module("triton.runtime.driver").driver
    # Triton 3.2 and later keep the active driver behind a property; 3.0 and 3.1 in an attribute.
    name = "_active" if isinstance(getattr(type(config), "active", None), property) else "active"
    activation.registry.set_attr(config, name, InterpretedDriver())
