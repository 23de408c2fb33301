"""activate() / deactivate(): choose a backend, apply every patch, undo them all.

``activate`` is idempotent and thread-safe. When torch is not imported yet it arms a
post-import hook and patches the moment torch finishes importing, so it works before or
after ``import torch``.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import sys

import wrapt

from . import _settings, _state, backends
from .errors import warn_once

log = logging.getLogger(__name__)


def activate(backend: str = None, **settings):
    """Redirect CUDA to the target backend. Returns the Backend, or None while torch is
    not imported yet (patching then happens when it is)."""
    with _state.LOCK:
        chosen = _settings.load(backend=backend, **settings)
        backends.check_name(chosen.backend)
        if _state.ACTIVE.settings is not None:
            if chosen != _state.ACTIVE.settings and (backend is not None or settings):
                warn_once("activate-twice", "cudashim is already active; the new settings are "
                          "ignored (call cudashim.deactivate() first)")
            return _state.ACTIVE.backend
        _state.ACTIVE.settings = chosen
        if _torch_imported():
            try:
                return _install(chosen)
            except BaseException:
                _state.ACTIVE.settings = _state.ACTIVE.backend = None    # nothing is active
                raise
        _state.ACTIVE.armed = True
        wrapt.register_post_import_hook(_on_torch_imported, "torch")
        return None


def _torch_imported() -> bool:
    torch = sys.modules.get("torch")
    # A torch module still executing its __init__ has no 'cuda' attribute yet.
    return torch is not None and hasattr(torch, "cuda") and hasattr(torch, "Tensor")


def _on_torch_imported(torch_module) -> None:
    with _state.LOCK:
        if not _state.ACTIVE.armed or _state.ACTIVE.backend is not None:
            return                     # deactivated meanwhile, or already installed
        try:
            _install(_state.ACTIVE.settings)
        except Exception as exc:       # an import must not fail because of cudashim
            _state.ACTIVE.settings = None
            _state.ACTIVE.armed = False
            warn_once("hook-failed", f"cudashim did not activate: {exc}", stacklevel=2)


def _install(settings):
    from .devices import DeviceTranslator
    from .patches import ORDER, PatchContext
    from .report import Report

    backend_cls, reason = backends.resolve(settings.backend)
    backend = backend_cls(settings)
    _state.ACTIVE.backend, _state.ACTIVE.reason, _state.ACTIVE.armed = backend, reason, False
    if not backend.redirects:
        log.info("cudashim: real CUDA is available; passing through, nothing patched (%s)", reason)
        return backend
    report = Report(backend.name) if (settings.report or settings.report_json) else None
    ctx = PatchContext(_state.REGISTRY, backend, DeviceTranslator(backend, report), settings, report)
    try:
        for group in ORDER:
            importlib.import_module(f"{__package__}.patches.{group}").install(ctx)
    except Exception:
        _state.REGISTRY.revert_all()   # never leave torch half-patched
        _state.ACTIVE.backend = _state.ACTIVE.settings = None
        raise
    if report is not None:
        report.write_at_exit(settings.report_json, settings.report)
    log.info("cudashim: CUDA redirected to %s, %s; %d patches", backend.describe(), reason,
             len(_state.REGISTRY))
    return backend


def deactivate() -> None:
    """Restore every patched attribute and sys.modules entry to the original object."""
    with _state.LOCK:
        _state.REGISTRY.revert_all()
        _state.ACTIVE.settings = _state.ACTIVE.backend = None
        _state.ACTIVE.armed = False
        _state.ACTIVE.reason = ""


def is_active() -> bool:
    """True once activate() was called and until deactivate() (patches may be waiting for
    torch to be imported)."""
    return _state.ACTIVE.settings is not None


def current_backend():
    """The Backend in force, or None."""
    return _state.ACTIVE.backend


@contextlib.contextmanager
def activated(backend: str = None, **settings):
    """``with cudashim.activated():`` redirects CUDA inside the block only."""
    was_active = is_active()
    result = activate(backend, **settings)
    try:
        yield result
    finally:
        if not was_active:
            deactivate()
