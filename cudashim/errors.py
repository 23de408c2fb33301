"""The exception and the warning category cudashim raises, and warn-once."""

from __future__ import annotations

import importlib
import os
import sys
import threading
import warnings
from typing import Tuple

import wrapt


class CudashimWarning(UserWarning):
    """Every warning cudashim issues is of this category (filter it as one)."""


def refusal(exc: BaseException) -> BaseException:
    """Mark ``exc`` as cudashim's answer to the program, not a fault of cudashim's: printed
    uncaught, its traceback ends at the program's frames (``patches.tracebacks``)."""
    exc.cudashim_refusal = True
    # Raised where cudashim handles another exception (a cache miss, say), it would show that
    # one first; as with ``raise ... from None``, the refusal stands alone.
    exc.__suppress_context__ = True
    return exc


def is_refusal(exc: BaseException) -> bool:
    return getattr(exc, "cudashim_refusal", False)


class UnsupportedCudaAPI(RuntimeError):
    """A CUDA API with no equivalent on the target backend.

    A RuntimeError, as torch raises for an operation a device does not support.
    """

    cudashim_refusal = True

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
    return refusal(error(f"CUDA error: invalid device ordinal {index} ({target} has {count} device(s)"
                         + (f"; {way_out})" if way_out else ")")))


class UnknownBackendError(ValueError):
    """A backend name that is not in cudashim's table."""


class BackendUnavailableError(RuntimeError):
    """A backend that was named explicitly but cannot run here."""


class ReportPathError(ValueError):
    """A report file that cannot be written where the settings say."""


_warned: set = set()
_warned_lock = threading.Lock()


# Frames a warning never points at: cudashim's own and the import machinery's (wrapt's
# post-import hooks included), so that it names the line of the program or library that led
# to it.
_MACHINERY = tuple(os.path.dirname(os.path.abspath(module.__file__)) + os.sep
                   for module in (sys.modules[__package__], importlib, wrapt)) + ("<frozen importlib",)


def warn_once(key: str, message: str, also_skip: Tuple[str, ...] = ()) -> None:
    """Warn the first time ``key`` is seen in this process, never again, at the first frame
    outside cudashim (and outside the folders in ``also_skip``)."""
    with _warned_lock:
        if key in _warned:
            return
        _warned.add(key)
    warnings.warn(message, CudashimWarning, stacklevel=_caller_level(_MACHINERY + also_skip))


def _caller_level(skipped: Tuple[str, ...]) -> int:
    """warnings.warn's stacklevel, counted from warn_once, of the first frame not in
    ``skipped``; the outermost frame where every frame is."""
    frame, level = sys._getframe(2), 2            # 1 is warn_once itself
    while frame.f_back is not None and frame.f_code.co_filename.startswith(skipped):
        frame = frame.f_back
        # warnings.warn does not count the import system's bootstrap frames.
        if not ("importlib" in frame.f_code.co_filename and "_bootstrap" in frame.f_code.co_filename):
            level += 1
    return level
