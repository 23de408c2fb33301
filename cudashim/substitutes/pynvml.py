"""cudashim's stand-in for pynvml (nvidia-ml-py): NVML's questions answered by the target.

Devices, names and memory come from the backend cudashim runs on, so they agree with
``torch.cuda.device_count()``, ``get_device_name()`` and ``mem_get_info()``. Versions come
from the CUDA build the program hears (``cudashim.cuda_build``), so the driver NVML reports
supports the CUDA that ``torch.version.cuda`` names. CPU affinity answers with the CPUs this
process may use on the NUMA node the device is given (devices are spread over the nodes
that hold such CPUs, as GPUs are over sockets), and ``nvmlDeviceSetCpuAffinity`` pins the
calling thread there. Utilization, temperature, power and clocks are read where the target
reports them (its device module's ``utilization()``/``temperature()``/``power_draw()``/
``clock_rate()``; on the CPU, ``/proc/stat``, the hardware monitor and cpufreq).

Whatever has no meaning on the target, or no reading there, raises NVML's own
``NVMLError_NotSupported``, as NVML does for a feature a GPU lacks, and monitoring code
already catches it: ``NOT_SUPPORTED`` says why for each family, and every other NVML call
answers the same. ``tests/test_substitutes.py`` classifies every function of the real
package against this module.
"""

from __future__ import annotations

import ctypes
import glob
import os
from typing import Dict, List, NamedTuple, Optional, Set

# --- errors: NVML's return codes, and one exception class per code ----------------------------
NVML_SUCCESS = 0
_ERROR_CODES = {
    "UNINITIALIZED": (1, "Uninitialized"), "INVALID_ARGUMENT": (2, "Invalid Argument"),
    "NOT_SUPPORTED": (3, "Not Supported"), "NO_PERMISSION": (4, "Insufficient Permissions"),
    "ALREADY_INITIALIZED": (5, "Already Initialized"), "NOT_FOUND": (6, "Not Found"),
    "INSUFFICIENT_SIZE": (7, "Insufficient Size"), "INSUFFICIENT_POWER": (8, "Insufficient External Power"),
    "DRIVER_NOT_LOADED": (9, "Driver Not Loaded"), "TIMEOUT": (10, "Timeout"),
    "IRQ_ISSUE": (11, "Interrupt Request Issue"), "LIBRARY_NOT_FOUND": (12, "NVML Shared Library Not Found"),
    "FUNCTION_NOT_FOUND": (13, "Function Not Found"), "CORRUPTED_INFOROM": (14, "Corrupted infoROM"),
    "GPU_IS_LOST": (15, "GPU is lost"), "RESET_REQUIRED": (16, "GPU requires restart"),
    "OPERATING_SYSTEM": (17, "The operating system has blocked the request."),
    "LIB_RM_VERSION_MISMATCH": (18, "RM has detected an NVML/RM version mismatch."),
    "IN_USE": (19, "In use by another client"), "MEMORY": (20, "Insufficient Memory"),
    "NO_DATA": (21, "No data"), "VGPU_ECC_NOT_SUPPORTED": (22, "ECC is not supported"),
    "INSUFFICIENT_RESOURCES": (23, "Insufficient resources"),
    "FREQ_NOT_SUPPORTED": (24, "Frequency not supported"),
    "ARGUMENT_VERSION_MISMATCH": (25, "Argument version mismatch"),
    "DEPRECATED": (26, "Deprecated"), "NOT_READY": (27, "Not ready"),
    "GPU_NOT_FOUND": (28, "GPU not found"), "INVALID_STATE": (29, "Invalid state"),
    "RESET_TYPE_NOT_SUPPORTED": (30, "Reset type not supported"), "UNKNOWN": (999, "Unknown Error"),
}


class NVMLError(Exception):
    """NVML's error; ``value`` is the return code. As in nvidia-ml-py, ``NVMLError(code)``
    makes an instance of that code's own class, so ``except NVMLError_NotSupported`` and
    ``e.value == NVML_ERROR_NOT_SUPPORTED`` both work."""

    _by_value: Dict[int, type] = {}

    def __new__(cls, value: int = 999):
        return Exception.__new__(cls._by_value.get(value, cls) if cls is NVMLError else cls)

    def __init__(self, value: int = 999):
        self.value = value
        self.args = (value,)                  # pickles and copies back to the same error

    def __str__(self):
        return nvmlErrorString(self.value)

    def __eq__(self, other):
        return isinstance(other, NVMLError) and self.value == other.value

    __hash__ = Exception.__hash__


def _error_class(suffix: str, value: int) -> type:
    name = "NVMLError_" + "".join(word.capitalize() for word in suffix.split("_"))

    def __init__(self, value=value):
        NVMLError.__init__(self, value)

    cls = type(name, (NVMLError,), {"__init__": __init__, "__module__": __name__})
    NVMLError._by_value[value] = cls
    return cls


for _suffix, (_value, _) in _ERROR_CODES.items():
    globals()[f"NVML_ERROR_{_suffix}"] = _value
    _class = _error_class(_suffix, _value)
    globals()[_class.__name__] = _class
_MESSAGES = {value: message for value, message in _ERROR_CODES.values()}


def nvmlErrorString(result: int) -> str:
    return "Success" if result == NVML_SUCCESS else _MESSAGES.get(result, _MESSAGES[999])


def _fail(code: str):
    raise NVMLError(_ERROR_CODES[code][0])


# --- constants programs pass in ----------------------------------------------------------------
NVML_TEMPERATURE_GPU, NVML_TEMPERATURE_COUNT = 0, 2
NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM, NVML_CLOCK_MEM, NVML_CLOCK_VIDEO, NVML_CLOCK_COUNT = 0, 1, 2, 3, 4
NVML_CLOCK_ID_CURRENT, NVML_CLOCK_ID_APP_CLOCK_TARGET = 0, 1
NVML_CLOCK_ID_APP_CLOCK_DEFAULT, NVML_CLOCK_ID_CUSTOMER_BOOST_MAX = 2, 3
NVML_AFFINITY_SCOPE_NODE, NVML_AFFINITY_SCOPE_SOCKET = 0, 1
NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED = 0, 1
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
NVML_COMPUTEMODE_DEFAULT, NVML_COMPUTEMODE_EXCLUSIVE_THREAD = 0, 1
NVML_COMPUTEMODE_PROHIBITED, NVML_COMPUTEMODE_EXCLUSIVE_PROCESS = 2, 3
NVML_INIT_FLAG_NO_GPUS, NVML_INIT_FLAG_NO_ATTACH = 1, 2
NVML_DEVICE_NAME_BUFFER_SIZE = 64
NVML_DEVICE_UUID_BUFFER_SIZE = 80
NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE = 80


# --- what NVML returns -----------------------------------------------------------------------
# Records read by field name, as programs read NVML's structures (named tuples: defining one
# costs a tenth of a dataclass, and this module is imported at activation wherever torch has
# imported the real pynvml).
class c_nvmlMemory_t(NamedTuple):
    total: int
    free: int
    used: int


class c_nvmlMemory_v2_t(NamedTuple):
    version: int
    total: int
    reserved: int
    free: int
    used: int


class c_nvmlUtilization_t(NamedTuple):
    gpu: int
    memory: int


class c_nvmlProcessInfo_t(NamedTuple):
    pid: int
    usedGpuMemory: int
    gpuInstanceId: int = 0xFFFFFFFF
    computeInstanceId: int = 0xFFFFFFFF


class c_nvmlPciInfo_t(NamedTuple):
    busIdLegacy: str
    domain: int
    bus: int
    device: int
    pciDeviceId: int
    pciSubSystemId: int
    busId: str


class _Handle(NamedTuple):
    index: int


# --- what has no meaning on the target ------------------------------------------------------------
# A family (a name prefix) -> why NVML's NotSupported is the answer. Any NVML function this
# module does not define answers NotSupported too; these are the ones programs are known to call.
NOT_SUPPORTED: Dict[str, str] = {
    "nvmlDeviceGetEccMode": "the target reports no ECC mode",
    "nvmlDeviceGetTotalEccErrors": "the target keeps no ECC error counters",
    "nvmlDeviceGetMemoryErrorCounter": "the target keeps no ECC error counters",
    "nvmlDeviceGetDetailedEccErrors": "the target keeps no ECC error counters",
    "nvmlDeviceGetRetiredPages": "the target retires no memory pages",
    "nvmlDeviceGetSerial": "the target has no board serial number",
    "nvmlDeviceGetHandleBySerial": "the target has no board serial number",
    "nvmlDeviceGetPowerManagementLimit": "the target has no power cap NVML could report",
    "nvmlDeviceGetEnforcedPowerManagementLimit": "the target has no power cap NVML could report",
    "nvmlDeviceGetTotalEnergyConsumption": "the target has no energy counter",
    "nvmlDeviceGetFanSpeed": "the target has no fan NVML could read",
    "nvmlDeviceGetPerformanceState": "P-states are NVIDIA's",
    "nvmlDeviceGetCurrentClocksThrottleReasons": "clock throttle reasons are NVIDIA's",
    "nvmlDeviceGetCurrentClocksEventReasons": "clock event reasons are NVIDIA's",
    "nvmlDeviceGetMigMode": "MIG partitions exist only on NVIDIA GPUs",
    "nvmlDeviceGetNvLink": "NVLink exists only between NVIDIA GPUs",
    "nvmlDeviceGetP2PStatus": "peer access goes through torch on the target",
    "nvmlDeviceGetTopologyCommonAncestor": "the target reports no PCIe topology",
    "nvmlDeviceGetPersistenceMode": "persistence mode is NVIDIA's driver's",
    "nvmlDeviceGetBAR1MemoryInfo": "BAR1 is an NVIDIA GPU's window",
}


def _not_supported(name: str):
    def not_supported(*args, **kwargs):
        _initialized_or_fail()
        _fail("NOT_SUPPORTED")
    not_supported.__name__ = not_supported.__qualname__ = name
    return not_supported


def __getattr__(name: str):
    """Any other NVML call: NVML's own answer for a feature the device lacks."""
    if name.startswith("nvml"):
        return _not_supported(name)
    raise AttributeError(f"module 'pynvml' has no attribute {name!r}")


# --- life cycle --------------------------------------------------------------------------------
_initialized = 0


def _activation():
    from cudashim.substitutes import serving_activation

    activation = serving_activation()
    if activation is None:
        _fail("LIBRARY_NOT_FOUND")
    return activation


def _backend():
    return _activation().backend


def _build():
    from cudashim.cuda_build import cuda_build

    return cuda_build(_activation().settings.cuda_version)


def _initialized_or_fail() -> None:
    if not _initialized:
        _fail("UNINITIALIZED")


def _index(handle) -> int:
    _initialized_or_fail()
    if not isinstance(handle, _Handle):
        _fail("INVALID_ARGUMENT")
    return handle.index


def nvmlInit() -> None:
    global _initialized
    _backend()
    _initialized += 1


def nvmlInitWithFlags(flags: int) -> None:
    nvmlInit()


def nvmlShutdown() -> None:
    global _initialized
    _initialized_or_fail()
    _initialized -= 1


# --- system ----------------------------------------------------------------------------------------
def nvmlSystemGetDriverVersion() -> str:
    """The driver the CUDA release the program hears came with (570.86.10 for 12.8)."""
    return _build().driver


def nvmlSystemGetCudaDriverVersion() -> int:
    return _build().driver_cuda_version


nvmlSystemGetCudaDriverVersion_v2 = nvmlSystemGetCudaDriverVersion


def nvmlSystemGetNVMLVersion() -> str:
    return _build().nvml_version


def nvmlSystemGetProcessName(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{int(pid)}/exe")
    except OSError:
        _fail("NOT_FOUND")


# --- devices ---------------------------------------------------------------------------------------
def nvmlDeviceGetCount() -> int:
    _initialized_or_fail()
    return _backend().device_count()


nvmlDeviceGetCount_v2 = nvmlDeviceGetCount


def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
    if not 0 <= int(index) < nvmlDeviceGetCount():
        _fail("INVALID_ARGUMENT")
    return _Handle(int(index))


nvmlDeviceGetHandleByIndex_v2 = nvmlDeviceGetHandleByIndex


def nvmlDeviceGetHandleByUUID(uuid) -> _Handle:
    return _handle_where(nvmlDeviceGetUUID, uuid)


def nvmlDeviceGetHandleByPciBusId(pciBusId) -> _Handle:
    return _handle_where(lambda handle: nvmlDeviceGetPciInfo(handle).busId, pciBusId)


nvmlDeviceGetHandleByPciBusId_v2 = nvmlDeviceGetHandleByPciBusId


def _handle_where(answer, wanted) -> _Handle:
    wanted = wanted.decode() if isinstance(wanted, bytes) else str(wanted)
    for index in range(nvmlDeviceGetCount()):
        if str(answer(_Handle(index))).lower() == wanted.lower():
            return _Handle(index)
    _fail("NOT_FOUND")


def nvmlDeviceGetIndex(handle) -> int:
    return _index(handle)


def nvmlDeviceGetMinorNumber(handle) -> int:
    return _index(handle)


def nvmlDeviceGetName(handle) -> str:
    return _backend().get_device_name(_index(handle))


def nvmlDeviceGetUUID(handle) -> str:
    index = _index(handle)
    return f"GPU-cudashim-{_backend().name}-{index:08d}"


def nvmlDeviceGetPciInfo(handle) -> c_nvmlPciInfo_t:
    """A bus id per device (domain 0, bus = index + 1), consistent with the handle lookups."""
    index = _index(handle)
    bus_id = f"00000000:{index + 1:02X}:00.0"
    return c_nvmlPciInfo_t(busIdLegacy=bus_id[4:], domain=0, bus=index + 1, device=0,
                           pciDeviceId=0, pciSubSystemId=0, busId=bus_id)


nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo


def nvmlDeviceGetCudaComputeCapability(handle):
    return tuple(_backend().get_device_capability(_index(handle)))


def nvmlDeviceGetComputeMode(handle) -> int:
    _index(handle)
    return NVML_COMPUTEMODE_DEFAULT


def nvmlDeviceGetMemoryInfo(handle, version=None):
    free, total = _backend().mem_get_info(_index(handle))
    if version is not None:                # the _v2 structure, asked for by its version
        return c_nvmlMemory_v2_t(version=version, total=total, reserved=0, free=free,
                                 used=total - free)
    return c_nvmlMemory_t(total=total, free=free, used=total - free)


def nvmlDeviceGetUtilizationRates(handle) -> c_nvmlUtilization_t:
    index = _index(handle)
    backend = _backend()
    reported = _device_reading(backend, "utilization", index)
    if reported is None and backend.device_type != "cpu":
        _fail("NOT_SUPPORTED")
    free, total = backend.mem_get_info(index)
    memory = round(100 * (total - free) / total) if total else 0
    gpu = int(reported) if reported is not None else _cpu_busy_percent()
    return c_nvmlUtilization_t(gpu=gpu, memory=memory)


def nvmlDeviceGetTemperature(handle, sensor: int = NVML_TEMPERATURE_GPU) -> int:
    index = _index(handle)
    backend = _backend()
    reported = _device_reading(backend, "temperature", index)
    if reported is None and backend.device_type == "cpu":
        reported = _cpu_temperature()
    if reported is None:
        _fail("NOT_SUPPORTED")
    return int(reported)


def nvmlDeviceGetPowerUsage(handle) -> int:
    """Milliwatts, where the target reports its draw."""
    reported = _device_reading(_backend(), "power_draw", _index(handle))
    if reported is None:
        _fail("NOT_SUPPORTED")
    return int(reported)


def nvmlDeviceGetClockInfo(handle, type: int) -> int:
    """MHz: the target's clock rate where it reports one; on the CPU, the current core clock
    (for the graphics and SM clocks; the memory clock has no reading)."""
    index = _index(handle)
    backend = _backend()
    reported = _device_reading(backend, "clock_rate", index)
    if reported is None and backend.device_type == "cpu" and type in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM):
        reported = _cpu_clock_mhz("scaling_cur_freq")
    if reported is None:
        _fail("NOT_SUPPORTED")
    return int(reported)


def nvmlDeviceGetMaxClockInfo(handle, type: int) -> int:
    _index(handle)
    reported = None
    if _backend().device_type == "cpu" and type in (NVML_CLOCK_GRAPHICS, NVML_CLOCK_SM):
        reported = _cpu_clock_mhz("cpuinfo_max_freq")
    if reported is None:
        _fail("NOT_SUPPORTED")
    return reported


def nvmlDeviceGetClock(handle, type: int, id: int) -> int:
    if id == NVML_CLOCK_ID_CURRENT:
        return nvmlDeviceGetClockInfo(handle, type)
    if id == NVML_CLOCK_ID_CUSTOMER_BOOST_MAX:
        return nvmlDeviceGetMaxClockInfo(handle, type)
    _index(handle)
    _fail("NOT_SUPPORTED")


def nvmlDeviceGetComputeRunningProcesses(handle) -> List[c_nvmlProcessInfo_t]:
    """This process, with what it holds on the device."""
    index = _index(handle)
    return [c_nvmlProcessInfo_t(pid=os.getpid(), usedGpuMemory=_backend().memory_reserved(index))]


nvmlDeviceGetComputeRunningProcesses_v2 = nvmlDeviceGetComputeRunningProcesses
nvmlDeviceGetComputeRunningProcesses_v3 = nvmlDeviceGetComputeRunningProcesses


def nvmlDeviceGetGraphicsRunningProcesses(handle) -> List[c_nvmlProcessInfo_t]:
    _index(handle)
    return []


nvmlDeviceGetGraphicsRunningProcesses_v2 = nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetGraphicsRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetMPSComputeRunningProcesses = nvmlDeviceGetGraphicsRunningProcesses
nvmlDeviceGetMPSComputeRunningProcesses_v3 = nvmlDeviceGetGraphicsRunningProcesses


# --- CPU and memory affinity ---------------------------------------------------------------------
# The CPUs this process may use, as it started: nvmlDeviceClearCpuAffinity goes back to them.
_PROCESS_CPUS: Set[int] = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
    else set(range(os.cpu_count() or 1))


def _numa_nodes() -> Dict[int, Set[int]]:
    """{node: the CPUs this process may use there}, for the nodes holding any such CPU;
    one node 0 where the kernel shows none."""
    nodes = {}
    for path in sorted(glob.glob("/sys/devices/system/node/node[0-9]*/cpulist")):
        node = int(path.split("/")[-2][4:])
        try:
            with open(path) as cpulist:
                cpus = _parse_cpulist(cpulist.read()) & _PROCESS_CPUS
        except (OSError, ValueError):
            continue
        if cpus:
            nodes[node] = cpus
    return nodes or {0: set(_PROCESS_CPUS)}


def _parse_cpulist(text: str) -> Set[int]:
    cpus = set()
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.update(range(int(first), int(last or first) + 1))
    return cpus


def _node_of(index: int) -> int:
    nodes = sorted(_numa_nodes())
    return nodes[index % len(nodes)]


def _device_cpus(index: int, scope: int = NVML_AFFINITY_SCOPE_NODE) -> Set[int]:
    nodes = _numa_nodes()
    node = _node_of(index)
    if scope != NVML_AFFINITY_SCOPE_SOCKET:
        return nodes[node]
    socket = _socket_of(min(nodes[node]))
    return {cpu for cpus in nodes.values() for cpu in cpus if _socket_of(cpu) == socket}


def _socket_of(cpu: int) -> int:
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/topology/physical_package_id") as package:
            return int(package.read())
    except (OSError, ValueError):
        return 0


def _bitmask(members: Set[int], words: int):
    """NVML's answer: an array of ``words`` unsigned longs, bit ``i`` set for member ``i``."""
    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    mask = (ctypes.c_ulong * int(words))()
    for member in members:
        if member < bits * int(words):
            mask[member // bits] |= 1 << (member % bits)
    return mask


def nvmlDeviceGetCpuAffinity(handle, cpuSetSize: int):
    return _bitmask(_device_cpus(_index(handle)), cpuSetSize)


def nvmlDeviceGetCpuAffinityWithinScope(handle, cpuSetSize: int, scope: int):
    return _bitmask(_device_cpus(_index(handle), scope), cpuSetSize)


def nvmlDeviceSetCpuAffinity(handle) -> None:
    """Pin the calling thread to the device's CPUs, as NVML does."""
    _pin(_device_cpus(_index(handle)))


def nvmlDeviceClearCpuAffinity(handle) -> None:
    _index(handle)
    _pin(_PROCESS_CPUS)


def _pin(cpus: Set[int]) -> None:
    if not hasattr(os, "sched_setaffinity"):        # macOS: the kernel does not let threads pin
        _fail("NOT_SUPPORTED")
    os.sched_setaffinity(0, cpus)


def nvmlDeviceGetMemoryAffinity(handle, nodeSetSize: int, scope: int):
    return _bitmask({_node_of(_index(handle))}, nodeSetSize)


def nvmlDeviceGetNumaNodeId(handle) -> int:
    return _node_of(_index(handle))


for _name in NOT_SUPPORTED:
    globals()[_name] = _not_supported(_name)


# --- readings ----------------------------------------------------------------------------------
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


def _cpu_temperature() -> Optional[int]:
    """The CPU package sensor of the hardware monitor, in degrees C; None where none is readable."""
    for path in sorted(glob.glob("/sys/class/hwmon/hwmon*/temp1_input")):
        try:
            with open(path) as sensor:
                return int(sensor.read().strip()) // 1000
        except (OSError, ValueError):
            continue
    return None


def _cpu_clock_mhz(reading: str) -> Optional[int]:
    """cpufreq's ``reading`` for the first CPU this process may use, in MHz."""
    cpu = min(_PROCESS_CPUS)
    try:
        with open(f"/sys/devices/system/cpu/cpu{cpu}/cpufreq/{reading}") as frequency:
            return int(frequency.read()) // 1000
    except (OSError, ValueError):
        return None
