"""The backend table and detection.

``BUILT_IN`` maps every name cudashim ships to its class, in the order in which ``auto``
tries them. A built-in backend is its module and its line here: what else knows backends (the
command line, ``doctor``'s list of vendor packages) reads the classes.

A vendor package adds a backend without editing cudashim by declaring an entry point in the
group ``cudashim.backends`` (``name = "package.module:BackendClass"``, ``plugins.py``). Such
backends are tried after the built-in vendors and before the generic ``accelerator`` backend,
which then leaves their device type to them. Entry points are read only when a name is not
built in or when ``auto`` detects, never by a Python that does not ask.
"""

from __future__ import annotations

import importlib
import logging
from typing import Dict, Tuple, Type

from .. import plugins
from ..errors import BackendUnavailableError, UnknownBackendError

log = logging.getLogger(__name__)

AUTO = "auto"

# name -> "module:Class" (relative to this package), imported only when tried, so no
# backend's vendor package is imported unless that backend is used. The order is detection's:
# an explicit setting first (handled by resolve), then real CUDA (pass-through), XPU, NPU,
# HPU, MPS, backends from entry points, any other accelerator torch.accelerator reports, and
# the CPU last.
BUILT_IN: Dict[str, str] = {
    "cuda": ".cuda:CUDABackend",
    "xpu": ".xpu:XPUBackend",
    "npu": ".npu:NPUBackend",
    "hpu": ".hpu:HPUBackend",
    "mps": ".mps:MPSBackend",
    "accelerator": ".accelerator:AcceleratorBackend",
    "cpu": ".cpu:CPUBackend",
}
GENERIC = "accelerator"


def from_entry_points() -> Dict[str, str]:
    """name -> "module:Class" for every backend a package registered (read once)."""
    return plugins.registered(plugins.BACKENDS, (*BUILT_IN, AUTO))


def table() -> Dict[str, str]:
    """Every backend name and where its class lives: built in, then from entry points."""
    return {**BUILT_IN, **from_entry_points()}


def names() -> Tuple[str, ...]:
    return tuple(table())


def detection_order() -> Tuple[str, ...]:
    """The built-in order, with entry-point backends just before the generic one."""
    built_in = tuple(BUILT_IN)
    generic = built_in.index(GENERIC)
    return built_in[:generic] + tuple(from_entry_points()) + built_in[generic:]


def check_name(name: str) -> str:
    """Return ``name`` if it is ``auto`` or a known backend, else raise with the valid ones."""
    if name == AUTO or name in BUILT_IN or name in from_entry_points():
        return name
    raise UnknownBackendError(
        f"unknown cudashim backend '{name}'; valid: {', '.join((AUTO,) + names())}")


def backend_class(name: str) -> Type:
    module_name, _, class_name = table()[check_name(name)].partition(":")
    package = __name__ if module_name.startswith(".") else None
    module = importlib.import_module(module_name, package)
    return getattr(module, class_name)


def _absent_reason(name: str):
    """Why backend ``name`` cannot run here, or None. A broken vendor install is a reason."""
    cls = backend_class(name)
    try:
        reason = cls.absent_reason()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    if reason is None and name == GENERIC:
        found = cls.accelerator_type()
        owner = next((other for other in names() if other != GENERIC
                      and backend_class(other).device_type == found), None)
        if owner is not None:
            reason = f"the accelerator here is '{found}', which has its own backend '{owner}'"
    return reason


def load_devices(settings) -> None:
    """Load the devices the settings ask for before the target is chosen: cudashim's test
    accelerator (``--test-devices``), then the device extensions they name."""
    if settings.test_devices:
        from .. import testdevice
        testdevice.load(settings.test_devices)
    import_extensions(settings.device_extension)


def import_extensions(modules) -> None:
    """Import the device extensions the settings name, so that the devices they register are
    there to detect; one that cannot be imported stops activation with one line."""
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError as exc:
            raise BackendUnavailableError(
                f"the device extension '{module}' cannot be imported: {exc}") from None


def resolve(name: str) -> Tuple[Type, str]:
    """The backend class to use and why it was chosen."""
    check_name(name)
    if name != AUTO:
        reason = _absent_reason(name)
        if reason:
            raise BackendUnavailableError(f"cudashim backend '{name}' cannot run here: {reason}")
        return backend_class(name), "named explicitly"
    order = detection_order()
    for candidate in order:
        reason = _absent_reason(candidate)
        if reason is None:
            return backend_class(candidate), \
                f"detected ('{candidate}' is the first present in the order {', '.join(order)})"
        log.debug("backend %s not chosen: %s", candidate, reason)
    raise BackendUnavailableError("no cudashim backend can run here")  # cpu is always present


def survey() -> Dict[str, str]:
    """Every backend and whether it can run here (for ``cudashim doctor``)."""
    result = {}
    for name in names():
        reason = _absent_reason(name)
        result[name] = "present" if reason is None else f"absent: {reason}"
    return result
