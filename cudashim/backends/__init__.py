"""The backend table and detection.

``BACKENDS`` maps every name a user may pass to its class; ``DETECTION_ORDER`` is the
order in which ``auto`` tries them. A backend joins both here and nowhere else.
"""

from __future__ import annotations

import logging
from typing import Dict, Tuple, Type

from .._settings import BACKEND_AUTO
from ..errors import BackendUnavailableError, UnknownBackendError

log = logging.getLogger(__name__)

# name -> "module:Class", imported only when chosen, so no backend's vendor package is
# imported unless that backend is used.
BACKENDS: Dict[str, str] = {
    "cuda": "cuda:CUDABackend",
    "xpu": "xpu:XPUBackend",
    "npu": "npu:NPUBackend",
    "hpu": "hpu:HPUBackend",
    "mps": "mps:MPSBackend",
    "accelerator": "accelerator:AcceleratorBackend",
    "cpu": "cpu:CPUBackend",
}

# Explicit setting first (handled by resolve), then real CUDA (pass-through), XPU, NPU,
# HPU, MPS, any other accelerator torch.accelerator reports, and the CPU last.
DETECTION_ORDER: Tuple[str, ...] = ("cuda", "xpu", "npu", "hpu", "mps", "accelerator", "cpu")


def names() -> Tuple[str, ...]:
    return tuple(BACKENDS)


def check_name(name: str) -> str:
    """Return ``name`` if it is ``auto`` or a known backend, else raise with the valid ones."""
    if name == BACKEND_AUTO or name in BACKENDS:
        return name
    raise UnknownBackendError(
        f"unknown cudashim backend '{name}'; valid: {', '.join((BACKEND_AUTO,) + names())}")


def backend_class(name: str) -> Type:
    import importlib
    module_name, _, class_name = BACKENDS[check_name(name)].partition(":")
    module = importlib.import_module(f"{__name__}.{module_name}")
    return getattr(module, class_name)


def resolve(name: str) -> Tuple[Type, str]:
    """The backend class to use and why it was chosen."""
    check_name(name)
    if name != BACKEND_AUTO:
        cls = backend_class(name)
        reason = cls.absent_reason()
        if reason:
            raise BackendUnavailableError(f"cudashim backend '{name}' cannot run here: {reason}")
        return cls, "named explicitly"
    for candidate in DETECTION_ORDER:
        cls = backend_class(candidate)
        try:
            reason = cls.absent_reason()
        except Exception as exc:                      # a broken vendor install: try the next
            reason = f"{type(exc).__name__}: {exc}"
        if reason is None:
            return cls, f"detected ('{candidate}' is the first present in the order " \
                        f"{', '.join(DETECTION_ORDER)})"
        log.debug("backend %s not chosen: %s", candidate, reason)
    raise BackendUnavailableError("no cudashim backend can run here")  # cpu is always present


def survey() -> Dict[str, str]:
    """Every backend and whether it can run here (for ``cudashim doctor``)."""
    result = {}
    for name in BACKENDS:
        try:
            reason = backend_class(name).absent_reason()
        except Exception as exc:                      # a broken vendor install
            reason = f"{type(exc).__name__}: {exc}"
        result[name] = "present" if reason is None else f"absent: {reason}"
    return result
