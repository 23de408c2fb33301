"""activate() / deactivate(): choose a backend, apply every patch, undo them all.

``activate`` builds one ``Activation`` (the settings, the backend and why it was chosen, the
patch registry, the device translator and the report) and hands it to every patch group
and to the proxy ``torch.cuda``; nothing reaches for them through module globals. It is
idempotent and thread-safe. When torch is not imported yet it arms a post-import hook and
patches the moment torch finishes importing, so it works before or after ``import torch``,
and also from code that torch itself runs while it imports (a ``torch.backends`` entry
point, a post-import hook of a module torch imports). While it waits, a stand-in library imported
first (``import apex`` before ``import torch``) imports torch before it is looked up, and where
cudashim's own module imported torch (``cudashim.kernels``), patching waits for that module.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import importlib
import importlib.util
import logging
import os
import sys
import threading
import types
from typing import Any, Callable, Optional

import wrapt

from . import _settings, autograd_exit, backends, callers, speedups, torch_names
from .errors import warn_once
from .registry import PatchRegistry

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)
class Activation:
    """One activation, handed to everything that patches for it."""
    settings: Any
    backend: Any
    reason: str                        # why this backend was chosen
    registry: PatchRegistry
    translator: Any = None             # translation.DeviceTranslator (None when passing through)
    report: Any = None                 # report.Report, when the report is on
    precision: Any = None              # precision.PrecisionPolicy (None when passing through)
    compiled: Any = None               # cudashim._speedups where it runs (see speedups.py), else None
    callers: Any = None                # callers.CallerPolicy: who hears the truth
    residency: Any = None              # residency.Residency where device memory is host memory
    # torch's function -> make(function): what a rewrite of it wraps in torch's place, so that a
    # group's change beneath the device translation is still one patch of that name
    beneath: dict = dataclasses.field(default_factory=dict)
    # (the target's device object, place(tensor), memory): what a constructor's tensor made on
    # the device is handed to, where a group keeps track of them, and the device memory whose
    # holds(tensor) says whether a tensor made like another is on the device (patches/residency.py)
    placing: Any = None
    # pinned(tensor): what a constructor's tensor made with pin_memory=True is handed to, where
    # the target cannot pin and a group keeps track of pinned host memory (patches/residency.py)
    pinning: Any = None
    live: bool = True                  # False once deactivated: late hooks then patch nothing
    waiting_for_imports: list = dataclasses.field(default_factory=list)   # (module, patch)

    @property
    def reporting(self) -> bool:
        """Whether the report is on: patches that exist only to count are made only then."""
        return self.report is not None

    def count(self, api: str, became) -> None:
        """One use of ``api``, which became ``became``, for the report where it is on."""
        if self.report is not None:
            self.report.count(api, became)

    def replace(self, owner, name: str, make: Callable[[Any], Any]):
        """Patch ``owner.name`` with ``make(original)``; return the replacement. A name this
        torch release lacks (a public API newer than it) is no API a program can call: it is
        left alone, as the rewriter leaves its absent targets, and None is returned."""
        try:
            original = wrapt.resolve_path(owner, name)[2]
        except AttributeError:
            log.debug("cudashim: %s.%s is absent in this torch; not patched",
                      getattr(owner, "__name__", owner), name)
            return None
        replacement = make(original)
        self.registry.set_attr(owner, name, replacement)
        return replacement

    def when_imported(self, module_name: str, patch: Callable[[types.ModuleType], Any]) -> None:
        """Call ``patch(module)`` now if ``module_name`` is imported, else when it is, while
        this activation is live. Deactivation forgets the patch, so nothing of this
        activation outlives it through an import hook."""
        def if_live(module):
            if not self.live:
                return
            try:
                patch(module)
            except Exception as error:
                # A name this torch lacks never breaks the program's import: the patch is not
                # made, with one warning naming the torch and the name.
                lacking = torch_names.lacked_by_torch(error)
                if lacking is None:
                    raise
                import torch
                warn_once(f"import-{module_name}", f"cudashim leaves its patch of {module_name} out: "
                                                   f"torch {torch.__version__} has no {lacking}")

        module = sys.modules.get(module_name)
        if module is not None:
            if_live(module)
            return
        if not self.waiting_for_imports:
            self.registry.add_undo("patches waiting for imports", lambda: [
                _import_hooks.discard(*waiting) for waiting in self.waiting_for_imports])
        self.waiting_for_imports.append((module_name, if_live))
        _import_hooks.add(module_name, if_live)


class _ImportHooks:
    """One wrapt post-import hook per module name for the whole process, calling the patches
    that live activations wait with: wrapt keeps a hook until its module is imported, and
    one per activation would pile up over activate/deactivate cycles."""

    def __init__(self):
        self._waiting = {}                 # module name -> patches, in the order they came
        self._lock = threading.Lock()

    def add(self, module_name: str, patch) -> None:
        with self._lock:
            patches = self._waiting.get(module_name)
            armed = patches is not None
            if not armed:
                patches = self._waiting[module_name] = []
            patches.append(patch)
        if not armed:
            wrapt.register_post_import_hook(self._imported, module_name)

    def discard(self, module_name: str, patch) -> None:
        with self._lock:
            patches = self._waiting.get(module_name, [])
            if patch in patches:
                patches.remove(patch)

    def _imported(self, module) -> None:
        with self._lock:               # wrapt has dropped its hook: the next add arms another
            patches = self._waiting.pop(module.__name__, [])
        for patch in patches:
            patch(module)


_import_hooks = _ImportHooks()


_lock = threading.RLock()
_current: Optional[Activation] = None      # the activation in force, once torch is patched
_pending = None                            # Settings waiting for torch to finish importing


def activate(backend: str = None, *, settings=None, **options):
    """Redirect CUDA to the target backend. Returns the Backend, or None while torch is
    not imported yet, or still importing in this thread (patching happens when it is).

    ``settings`` takes a loaded ``Settings`` object (the launcher's); otherwise keyword
    options beat ``CUDASHIM_*`` variables, which beat the defaults.
    """
    global _pending
    if settings is not None and (backend is not None or options):
        raise TypeError("activate() takes settings= or keyword options, not both")
    with _lock, _collector_paused():
        chosen = settings if settings is not None else _settings.load(backend=backend, **options)
        if _current is not None or _pending is not None:
            in_force = _current.settings if _current is not None else _pending
            if chosen != in_force and (settings is not None or backend is not None or options):
                warn_once("activate-twice", "cudashim is already active; the new settings are "
                          "ignored (call cudashim.deactivate() first)")
            return _current.backend if _current is not None else None
        torch = sys.modules.get("torch")
        if torch is not None and not _initializing(torch):
            return _activate_now(chosen).backend
        _pending = chosen
        if torch is None:
            wrapt.register_post_import_hook(_on_torch_imported, "torch")
            _stand_ins_waiting.arm(chosen)
            return None
    _when_torch_half_imported(torch)       # outside the lock: it may wait for another thread
    return current_backend()               # None while this thread is inside torch's import


def _activate_now(settings) -> Activation:
    """Build and install the activation (torch is imported); nothing is left active on error."""
    global _current
    try:
        with _collector_paused():
            _current = _install(settings)
    except BaseException:
        _current = None
        raise
    return _current


@contextlib.contextmanager
def _collector_paused():
    """Pause the cyclic garbage collector, and restore it as it was.

    ``import torch`` leaves a full collection of its objects due, which the next few
    thousand allocations start (about 100 ms on a 2-core host, for some 170,000 objects).
    Activation makes that many, so without the pause it would run that collection inside
    activation. Where the program collects and an activation was installed inside the pause,
    what exists then is frozen on the way out (``_out_of_the_collectors_sight``): not after an
    activation that failed, one still waiting for torch's import, or a call that found one in
    force (the program's objects made since stay in the collector's sight).
    """
    was_enabled = gc.isenabled()
    in_force = _current
    gc.disable()
    installed = False
    try:
        yield
        installed = _current is not None and _current is not in_force
    finally:
        if was_enabled:
            if installed:
                _out_of_the_collectors_sight()
            gc.enable()


_frozen_by_activation = False    # whether activation froze the objects, from none frozen


def _out_of_the_collectors_sight() -> None:
    """Freeze what exists at activation: torch's objects, activation's, the modules imported.

    They live as long as the program, and every full collection walked them only to find them
    alive: some 190,000 objects, 50-70 ms a walk on a 2-core host, and the interpreter walks
    them at exit too (finalization took 270-310 ms after ``import torch``, 90 ms with them
    frozen). ``gc.freeze()`` moves them to the permanent generation without walking anything.
    The program's collections then walk only what the program makes, and those of its forked
    workers do not write to those objects' pages.

    The cost: a reference cycle among these objects that the program drops later is never
    collected, and ``gc.get_objects()`` no longer lists them (``gc.unfreeze()`` gives both
    back). A program that froze objects itself before activation keeps them frozen.
    """
    global _frozen_by_activation
    _frozen_by_activation = gc.get_freeze_count() == 0
    gc.freeze()


def _back_in_the_collectors_sight() -> None:
    """Undo activation's freeze where it froze from none frozen. The count of frozen objects
    cannot tell whether the program froze more since (it falls as frozen objects die), so
    those go back with the rest: a program that freezes before forking does it again."""
    global _frozen_by_activation
    if _frozen_by_activation:
        gc.unfreeze()
    _frozen_by_activation = False


def _initializing(module: types.ModuleType) -> bool:
    """Whether ``module`` is still executing its body (importlib marks its spec so)."""
    return bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


def _when_torch_half_imported(torch) -> None:
    """Call ``_on_torch_imported`` once torch is whole.

    wrapt fires a post-import hook at once when the name is in ``sys.modules``, which it is
    while torch is still importing; so a half-imported torch is waited for here instead.
    """
    body = _frame_running(torch)
    if body is None:                   # another thread imports torch: wait for its lock
        _on_torch_imported(importlib.import_module("torch"))
    else:                              # this thread is inside torch's own import
        _after_return(body, lambda: _on_torch_imported(torch))


def _frame_running(module: types.ModuleType):
    """The frame executing ``module``'s body in this thread, or None."""
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is vars(module) and frame.f_code.co_name == "<module>":
            return frame
        frame = frame.f_back
    return None


def _after_return(frame, callback) -> None:
    """Run ``callback`` when ``frame`` returns, through this thread's profile hook (the only
    event Python offers for it), chaining to a Python-level profiler that was set."""
    previous = sys.getprofile()
    if previous is not None and not callable(previous):
        warn_once("activate-in-import", "cudashim did not activate: it was asked to while torch "
                  "was importing, under a profiler; activate after 'import torch' instead")
        return

    def profile(current, event, arg):
        if previous is not None:
            previous(current, event, arg)
        if event == "return" and current is frame:
            sys.setprofile(previous)
            callback()

    sys.setprofile(profile)


def _cudashim_module_importing():
    """The frame running the body of the outermost cudashim module that is importing now in this
    thread (its body not yet returned), or None."""
    outermost = None
    frame = sys._getframe(1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if frame.f_code.co_name == "<module>" and name.startswith("cudashim.") and \
                _initializing(sys.modules.get(name)):
            outermost = frame
        frame = frame.f_back
    return outermost


class _StandInsWaiting:
    """While activation waits for torch: the import of a library cudashim serves a stand-in for
    (flash_attn, xformers, apex, amp_C) imports torch first, so that activation, and the finder it
    installs (``substitutes/finder.py``), are there to answer it. A program sorted by isort
    imports ``apex`` and ``flash_attn`` before ``torch``, and each of them imports torch itself.
    Not pynvml, which imports no torch (a monitoring tool would pay for it): one imported first
    is decided when torch is (``SubstituteFinder.replace_imported``). A meta path finder that
    finds nothing itself: it answers with what the finders answer once activation is there."""

    def __init__(self):
        self.names = frozenset()

    def arm(self, settings) -> None:
        from .substitutes import LIBRARIES
        from .substitutes.finder import enabled_libraries
        self.names = frozenset(module for name in enabled_libraries(settings) if LIBRARIES[name].imports_torch
                               for module in LIBRARIES[name].modules)
        if self.names and self not in sys.meta_path:
            sys.meta_path.insert(0, self)

    def disarm(self) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.names or "torch" in sys.modules:
            return None
        self.disarm()
        importlib.import_module("torch")             # activation happens as it returns
        return importlib.util.find_spec(fullname)


_stand_ins_waiting = _StandInsWaiting()


def _on_torch_imported(torch_module, waited: bool = False) -> None:
    global _pending
    _stand_ins_waiting.disarm()
    importer = None if waited else _cudashim_module_importing()
    if importer is not None:
        # cudashim's own module imported torch (``from cudashim.kernels import packbits`` before
        # ``import torch``), and activation imports from it: it waits for that module's body to
        # return (the outermost such module's: none around it is importing then).
        _after_return(importer, lambda: _on_torch_imported(torch_module, waited=True))
        return
    with _lock:
        settings, _pending = _pending, None
        if settings is None or _current is not None:
            return                     # deactivated meanwhile, or already installed
        try:
            _activate_now(settings)
        except Exception as exc:       # an import must not fail because of cudashim
            # At the program's ``import torch``, not in torch's own last line.
            warn_once("hook-failed", f"cudashim did not activate: {exc}",
                      also_skip=(os.path.dirname(torch_module.__file__) + os.sep,))


def _install(settings) -> Activation:
    from . import patches
    from .kernels import native
    from .precision import PrecisionPolicy
    from .translation import DeviceTranslator

    backends.load_devices(settings)
    backend_cls, reason = backends.resolve(settings.backend)
    backend = backend_cls(settings)
    registry = PatchRegistry()
    if not backend.redirects:
        log.info("cudashim: real CUDA is available; passing through, nothing patched (%s)", reason)
        return Activation(settings, backend, reason, registry)
    report = None
    if settings.report or settings.report_json:
        from .report import Report, check_writable     # a module only a report needs

        if settings.report_json:
            check_writable(settings.report_json)
        report = Report(backend.name)
    activation = Activation(settings, backend, reason, registry,
                            DeviceTranslator(backend, report), report,
                            PrecisionPolicy.of(backend, settings), speedups.chosen(settings),
                            callers.CallerPolicy(settings.honest_for))
    # The host kernels (a library too) hear the activation's setting, not the environment's.
    registry.set_attr(native, "handed_portable", bool(settings.pure_python))
    try:
        patches.apply_all(activation)
    except BaseException:
        activation.live = False
        registry.revert_all()          # never leave torch half-patched
        raise
    autograd_exit.arm(activation)
    if report is not None:
        report.write_at_exit(settings.report_json, settings.report)
    log.info("cudashim: CUDA redirected to %s, %s; %d patches", backend.describe(), reason,
             len(registry))
    return activation


def deactivate() -> None:
    """Restore every patched attribute and sys.modules entry to the original object."""
    global _current, _pending
    with _lock:
        if _current is not None:
            _current.live = False
            _current.registry.revert_all()
            _back_in_the_collectors_sight()
        _current = _pending = None
        _stand_ins_waiting.disarm()


def is_active() -> bool:
    """True once activate() was called and until deactivate() (patches may be waiting for
    torch to be imported)."""
    return _current is not None or _pending is not None


def current_activation() -> Optional[Activation]:
    """The Activation in force (None before torch is patched, and after deactivation)."""
    return _current


def current_backend():
    """The Backend in force, or None."""
    return _current.backend if _current is not None else None


def get_original(owner, name: str):
    """``owner.name`` as it was before cudashim patched it (itself when unpatched)."""
    activation = _current
    if activation is None:
        return getattr(owner, name)
    return activation.registry.original(owner, name)


@contextlib.contextmanager
def activated(backend: str = None, *, settings=None, **options):
    """``with cudashim.activated():`` redirects CUDA inside the block only."""
    was_active = is_active()
    result = activate(backend, settings=settings, **options)
    try:
        yield result
    finally:
        if not was_active:
            deactivate()
