"""The backend table and detection.

A built-in backend is one module here, named for it, holding its class: ``built_in()`` finds
the names without importing anything, and each class says where ``auto`` tries it
(``detection_rank``). What else knows backends (the command line, ``doctor``'s list of vendor
packages) reads the names and the classes, so adding one touches nothing else.

A vendor package adds a backend without editing cudashim by declaring an entry point in the
group ``cudashim.backends`` (``name = "package.module:BackendClass"``, ``plugins.py``). Such
backends are tried after the built-in vendors and before the generic ``accelerator`` backend,
which then leaves their device type to them. Entry points are read only when a name is not
built in or when ``auto`` detects, never by a Python that does not ask.
"""

from __future__ import annotations

import functools
import importlib
import logging
import pkgutil
from typing import Dict, Tuple, Type

from .. import plugins
from ..errors import BackendUnavailableError, UnknownBackendError

log = logging.getLogger(__name__)

AUTO = "auto"

# The modules here that serve the backends rather than being one.
SUPPORT = frozenset({"base", "host", "staged", "cpu_speed", "timing"})
GENERIC = "accelerator"


@functools.lru_cache(maxsize=None)
def built_in() -> Tuple[str, ...]:
    """Every backend cudashim ships, by name: its modules here, found without importing them
    (so no vendor package, and no torch, is imported until a backend is tried)."""
    return tuple(sorted(module.name for module in pkgutil.iter_modules(__path__)
                        if not module.name.startswith("_") and module.name not in SUPPORT))


def from_entry_points() -> Dict[str, str]:
    """name -> "module:Class" for every backend a package registered (read once)."""
    return plugins.registered(plugins.BACKENDS, (*built_in(), AUTO))


def names() -> Tuple[str, ...]:
    """Every backend name: built in, then from entry points."""
    return built_in() + tuple(from_entry_points())


def detection_order() -> Tuple[str, ...]:
    """Where ``auto`` looks: an explicit setting first (handled by resolve), then real CUDA
    (pass-through), the vendors' backends, backends from entry points, any other accelerator
    torch.accelerator reports, and the CPU last; each built-in class says where it goes."""
    ranked = tuple(sorted(built_in(), key=lambda name: backend_class(name).detection_rank))
    generic = ranked.index(GENERIC)
    return ranked[:generic] + tuple(from_entry_points()) + ranked[generic:]


def check_name(name: str) -> str:
    """Return ``name`` if it is ``auto`` or a known backend, else raise with the valid ones."""
    if name == AUTO or name in built_in() or name in from_entry_points():
        return name
    raise UnknownBackendError(
        f"unknown cudashim backend '{name}'; valid: {', '.join((AUTO,) + names())}")


def backend_class(name: str) -> Type:
    """The class of backend ``name``, imported now: a built-in module's backend named so, or
    the class an entry point names."""
    if check_name(name) in built_in():
        module = importlib.import_module(f"{__name__}.{name}")
        from .base import Backend
        return next(value for value in vars(module).values()
                    if isinstance(value, type) and issubclass(value, Backend)
                    and value.__module__ == module.__name__ and value.name == name)
    module_name, _, class_name = from_entry_points()[name].partition(":")
    return getattr(importlib.import_module(module_name), class_name)


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
