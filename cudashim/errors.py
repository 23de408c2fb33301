"""The exception and the warning category cudashim raises, and warn-once."""

from __future__ import annotations

import threading
import warnings


class CudashimWarning(UserWarning):
    """Every warning cudashim issues is of this category (filter it as one)."""


class UnsupportedCudaAPI(RuntimeError):
    """A CUDA API with no equivalent on the target backend.

    A RuntimeError, as torch raises for an operation a device does not support.
    """

    def __init__(self, api: str, backend: str, way_out: str):
        self.api, self.backend, self.way_out = api, backend, way_out
        super().__init__(f"{api} is not supported by cudashim on the '{backend}' backend: {way_out}")


class UnsupportedCudaImport(UnsupportedCudaAPI, ImportError):
    """A name of a CUDA-only library that cudashim's stand-in for it does not provide.

    Also an ImportError, so that ``try: from apex.contrib import ... except ImportError:``
    takes the program's own fallback, as it would where the library is not installed.
    """

    def __init__(self, api: str, backend: str, way_out: str):
        super().__init__(api, backend, way_out)
        self.name = api


def invalid_device_ordinal(index: int, count: int, target: str, way_out: str = "") -> RuntimeError:
    """CUDA's error for an index past the devices: ``torch.AcceleratorError`` where torch has
    it (as CUDA raises since torch 2.8), else a RuntimeError; ``way_out`` says how to get more."""
    import torch
    error = getattr(torch, "AcceleratorError", RuntimeError)
    return error(f"CUDA error: invalid device ordinal {index} ({target} has {count} device(s)"
                 + (f"; {way_out})" if way_out else ")"))


class UnknownBackendError(ValueError):
    """A backend name that is not in cudashim's table."""


class BackendUnavailableError(RuntimeError):
    """A backend that was named explicitly but cannot run here."""


class ReportPathError(ValueError):
    """A report file that cannot be written where the settings say."""


_warned: set = set()
_warned_lock = threading.Lock()


def warn_once(key: str, message: str, stacklevel: int = 3) -> None:
    """Warn the first time ``key`` is seen in this process, never again."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, CudashimWarning, stacklevel=stacklevel)
