"""cudashim's stand-in for pynvml (nvidia-ml-py): NVML's questions answered by the target.

Devices, names and memory come from the backend cudashim runs on, so they agree with
``torch.cuda.device_count()``, ``get_device_name()`` and ``mem_get_info()``. Utilization,
temperature and power are read where the target reports them (the device module's
``utilization()``/``temperature()``/``power_draw()``; on the CPU, ``/proc/stat`` and the
hardware monitor); where it does not, the documented neutral value is 0. NVML calls with no
equivalent raise ``NVMLError_NotSupported``, which telemetry code already catches.
"""

from __future__ import annotations

import dataclasses
import glob
import os
from typing import List, Optional

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM = 0, 1, 2
NVML_DEVICE_NAME_BUFFER_SIZE = 96


class NVMLError(Exception):
    """NVML's error; ``value`` is the NVML return code, as in nvidia-ml-py."""

    _messages = {NVML_ERROR_UNINITIALIZED: "Uninitialized",
                 NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
                 NVML_ERROR_NOT_SUPPORTED: "Not Supported",
                 NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found"}

    def __init__(self, value: int):
        self.value = value
        super().__init__(self._messages.get(value, f"Unknown Error ({value})"))


class NVMLError_Uninitialized(NVMLError):
    def __init__(self):
        super().__init__(NVML_ERROR_UNINITIALIZED)


class NVMLError_InvalidArgument(NVMLError):
    def __init__(self):
        super().__init__(NVML_ERROR_INVALID_ARGUMENT)


class NVMLError_NotSupported(NVMLError):
    def __init__(self):
        super().__init__(NVML_ERROR_NOT_SUPPORTED)


class NVMLError_LibraryNotFound(NVMLError):
    def __init__(self):
        super().__init__(NVML_ERROR_LIBRARY_NOT_FOUND)


@dataclasses.dataclass
class c_nvmlMemory_t:
    total: int
    free: int
    used: int


@dataclasses.dataclass
class c_nvmlUtilization_t:
    gpu: int
    memory: int


@dataclasses.dataclass
class c_nvmlProcessInfo_t:
    pid: int
    usedGpuMemory: int


@dataclasses.dataclass(frozen=True)
class _Handle:
    index: int


_initialized = 0


def _backend():
    from cudashim.activation import current_backend

    backend = current_backend()
    if backend is None:
        raise NVMLError_LibraryNotFound()
    return backend


def _check(handle) -> int:
    if not _initialized:
        raise NVMLError_Uninitialized()
    if not isinstance(handle, _Handle):
        raise NVMLError_InvalidArgument()
    return handle.index


# --- life cycle ----------------------------------------------------------------------------
def nvmlInit() -> None:
    global _initialized
    _backend()
    _initialized += 1


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    global _initialized
    if not _initialized:
        raise NVMLError_Uninitialized()
    _initialized -= 1


# --- system ---------------------------------------------------------------------------------
def nvmlSystemGetDriverVersion() -> str:
    import torch

    return f"cudashim-{_backend().name}-torch-{torch.__version__}"


def nvmlSystemGetCudaDriverVersion() -> int:
    from cudashim.activation import current_activation

    major, minor = (current_activation().settings.cuda_version.split(".") + ["0"])[:2]
    return int(major) * 1000 + int(minor) * 10


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion


def nvmlSystemGetNVMLVersion() -> str:
    from cudashim.substitutes import LIBRARIES

    return LIBRARIES["pynvml"].full_version


# --- devices --------------------------------------------------------------------------------
def nvmlDeviceGetCount() -> int:
    if not _initialized:
        raise NVMLError_Uninitialized()
    return _backend().device_count()


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    if not 0 <= int(index) < nvmlDeviceGetCount():
        raise NVMLError_InvalidArgument()
    return _Handle(int(index))


def nvmlDeviceGetIndex(handle) -> int:
    return _check(handle)


def nvmlDeviceGetName(handle) -> str:
    return _backend().get_device_name(_check(handle))


def nvmlDeviceGetUUID(handle) -> str:
    index = _check(handle)
    return f"GPU-cudashim-{_backend().name}-{index:08d}"


def nvmlDeviceGetMemoryInfo(handle, version=None) -> c_nvmlMemory_t:
    free, total = _backend().mem_get_info(_check(handle))
    return c_nvmlMemory_t(total=total, free=free, used=total - free)


def nvmlDeviceGetCudaComputeCapability(handle):
    return tuple(_backend().get_device_capability(_check(handle)))


def nvmlDeviceGetUtilizationRates(handle) -> c_nvmlUtilization_t:
    index = _check(handle)
    backend = _backend()
    free, total = backend.mem_get_info(index)
    memory = round(100 * (total - free) / total) if total else 0
    reported = _device_reading(backend, "utilization", index)
    gpu = int(reported) if reported is not None else (
        _cpu_busy_percent() if backend.device_type == "cpu" else 0)
    return c_nvmlUtilization_t(gpu=gpu, memory=memory)


def nvmlDeviceGetTemperature(handle, sensor: int = NVML_TEMPERATURE_GPU) -> int:
    index = _check(handle)
    backend = _backend()
    reported = _device_reading(backend, "temperature", index)
    if reported is not None:
        return int(reported)
    return _cpu_temperature() if backend.device_type == "cpu" else 0


def nvmlDeviceGetPowerUsage(handle) -> int:
    """Milliwatts; 0 where the target does not report its draw."""
    index = _check(handle)
    reported = _device_reading(_backend(), "power_draw", index)
    return int(reported) if reported is not None else 0


def nvmlDeviceGetEnforcedPowerManagementLimit(handle) -> int:
    _check(handle)
    raise NVMLError_NotSupported()


nvmlDeviceGetPowerManagementLimit = nvmlDeviceGetEnforcedPowerManagementLimit


def nvmlDeviceGetComputeRunningProcesses(handle) -> List[c_nvmlProcessInfo_t]:
    """This process, with what it holds on the device."""
    index = _check(handle)
    return [c_nvmlProcessInfo_t(pid=os.getpid(), usedGpuMemory=_backend().memory_reserved(index))]


nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetGraphicsRunningProcesses(handle) -> List[c_nvmlProcessInfo_t]:
    _check(handle)
    return []


def __getattr__(name: str):
    """Any other NVML call: NVML's own answer for a feature the device lacks."""
    if name.startswith("nvml"):
        def not_supported(*args, **kwargs):
            if not _initialized:
                raise NVMLError_Uninitialized()
            raise NVMLError_NotSupported()
        not_supported.__name__ = name
        return not_supported
    raise AttributeError(f"module 'pynvml' has no attribute {name!r}")


# --- readings --------------------------------------------------------------------------------
def _device_reading(backend, name: str, index: int) -> Optional[float]:
    """``torch.<device>.<name>(index)`` where the target's device module has it."""
    if backend.device_type == "cpu":
        return None
    reading = getattr(backend.device_module, name, None)
    if reading is None:
        return None
    try:
        return reading(index)
    except Exception:                       # a vendor runtime without the sensor
        return None


_last_cpu_times: Optional[tuple] = None


def _cpu_busy_percent() -> int:
    """The share of CPU time not idle since the previous call (since boot, the first time)."""
    global _last_cpu_times
    try:
        with open("/proc/stat") as stat:
            fields = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return 0
    idle, total = fields[3] + (fields[4] if len(fields) > 4 else 0), sum(fields)
    previous, _last_cpu_times = _last_cpu_times, (idle, total)
    if previous is not None and total > previous[1]:
        idle, total = idle - previous[0], total - previous[1]
    return round(100 * (total - idle) / total) if total else 0


def _cpu_temperature() -> int:
    """The CPU package sensor of the hardware monitor, in degrees C; 0 where none is readable."""
    for path in sorted(glob.glob("/sys/class/hwmon/hwmon*/temp1_input")):
        try:
            with open(path) as sensor:
                return int(sensor.read().strip()) // 1000
        except (OSError, ValueError):
            continue
    return 0
