"""The import hook that serves a stand-in under a CUDA-only library's own name.

``SubstituteFinder`` sits first on ``sys.meta_path`` while cudashim is active. At the first
import of a library's top-level name it decides once:

1. the real package is not installed: the stand-in is served;
2. it is installed: it is imported as Python would, then tried on the target
   (``probes.py``); if the import raises or the try fails, everything it left in
   ``sys.modules`` is removed and the stand-in is served; otherwise the real module is
   handed to the import that asked, untouched.

A library already imported when cudashim activates (``import torch`` imports pynvml itself
where it is installed) gets the same decision at activation (``replace_imported``): where the
real package fails its try, its modules leave ``sys.modules`` for the stand-in, and every
module-level reference to them (``torch.cuda.pynvml``, a program's ``from pynvml import
nvmlInit``) is pointed at the stand-in's, through the registry; deactivation puts the real
modules and references back.

Submodules follow their parent's ``__path__``, so ``import flash_attn.bert_padding`` finds
the stand-in's file, or the real one, with no help. The finder also answers
``importlib.metadata`` for a stand-in whose real distribution is not installed, so libraries
that check a version before importing (transformers' ``is_flash_attn_2_available()``)
accept it.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import importlib.util
import logging
import re
import sys
import threading
import types
from typing import Dict, Iterable, Iterator, Tuple

from ..patching.import_hook import ImportHook
from ..tables.libraries import LIBRARIES as TABLE, StandIn
from . import LIBRARIES, probes, provides, source_of
from ._refuse import refusal

log = logging.getLogger(__name__)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class StandInDistribution(importlib.metadata.Distribution):
    """The metadata a stand-in answers to: its distribution name, a version with the
    ``+cudashim`` local label, and the import names it provides."""

    def __init__(self, library: StandIn):
        self.library = library

    def read_text(self, filename):
        if filename in ("METADATA", "PKG-INFO"):
            return (f"Metadata-Version: 2.1\nName: {self.library.distribution}\n"
                    f"Version: {self.library.full_version}\n"
                    f"Summary: cudashim's stand-in for {self.library.name} on torch operations\n")
        if filename == "top_level.txt":
            return "\n".join(self.library.modules) + "\n"
        return None

    def locate_file(self, path):
        return source_of(self.library.modules[0]).parent / path


class _ImportedLoader(importlib.abc.Loader):
    """Hands an already imported real module to the import statement that asked for it."""

    def __init__(self, module):
        self.module = module
        self.spec = module.__spec__

    def create_module(self, spec):
        return self.module

    def exec_module(self, module):
        module.__spec__ = self.spec            # the import machinery set ours; put its own back


class _RefusingLoader(importlib.abc.Loader):
    """For a part of a library its stand-in does not provide: importing it raises
    ``UnsupportedCudaImport`` (an ImportError), naming the way out."""

    def __init__(self, library: StandIn):
        self.library = library

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        way_out = TABLE[self.library.name].way_out
        raise refusal(module.__name__, f"it provides {self.library.substituted}; instead, {way_out}")


class SubstituteFinder(ImportHook):
    description = "the import hook for CUDA-only libraries"

    def __init__(self, activation, enabled: Iterable[str]):
        super().__init__(activation)
        self.serving_for = activation              # what the stand-ins it serves ask about
        self.device = activation.backend.target_device(0)
        self.by_module: Dict[str, StandIn] = {module: LIBRARIES[name] for name in enabled
                                              for module in LIBRARIES[name].modules}
        self.decisions: Dict[str, importlib.machinery.ModuleSpec] = {}
        self.served: Dict[str, str] = {}       # import name -> why the stand-in was served
        self.kept: Dict[str, str] = {}         # import name -> why the real package was kept
        self._trying: set = set()              # names being imported for real, in this finder
        self.displaced: Dict[str, types.ModuleType] = {}   # real modules imported before us
        self._lock = threading.RLock()
        # the search of every imported module for references (``_holding``), compiled or not
        self._holding = getattr(activation.compiled, "holding", None) or _holding

    # --- imports -----------------------------------------------------------------------
    def spec_for(self, fullname):
        top, dot, _ = fullname.partition(".")
        if dot:                                # a submodule follows its parent's __path__...
            if top in self.served and not provides(fullname):
                return importlib.util.spec_from_loader(fullname, _RefusingLoader(self.by_module[top]))
            return None                        # ...unless the stand-in lacks it
        library = self.by_module.get(fullname)
        if library is None or fullname in self._trying:
            return None
        with self._lock:
            spec = self.decisions.get(fullname)
            if spec is None:
                spec = self.decisions[fullname] = self._decide(library, fullname)
            return spec

    def replace_imported(self, registry) -> None:
        """Decide now for every library imported before activation, as its first import
        would have; where the stand-in is served, point the references cudashim can reach
        at it."""
        for name, library in self.by_module.items():
            real = sys.modules.get(name)
            if real is None or name in self.decisions:
                continue
            with self._lock:
                why_not = probes.why_not_working(library, real, self.device) \
                    if name == library.modules[0] else None
                if why_not is None:
                    self.kept[name] = "the real package, imported before activation, works on the target"
                    self.decisions[name] = importlib.util.spec_from_loader(name, _ImportedLoader(real))
                    continue
                why = f"the real package, imported before activation, {why_not}"
                displaced = {m: sys.modules[m] for m in _family(name)}
                self.displaced.update(displaced)
                self.decisions[name] = self._serve(library, name, why)
                stand_in = importlib.import_module(name)
            for owner, attribute, value in _references_to(displaced, stand_in, self._holding):
                try:
                    registry.set_attr(owner, attribute, value)
                except (AttributeError, TypeError) as exc:     # a module that refuses writes
                    log.debug("cudashim: %s.%s keeps the real %s: %s",
                              owner.__name__, attribute, name, exc)

    def _decide(self, library: StandIn, name: str):
        if self._real_spec(name) is None:
            return self._serve(library, name, "the real package is not installed")
        self._trying.add(name)
        try:
            module = importlib.import_module(name)
        except Exception as exc:
            why = f"the real package fails to import: {type(exc).__name__}: {exc}"
            return self._serve(library, name, why.splitlines()[0][:200])
        finally:
            self._trying.discard(name)
        why_not = probes.why_not_working(library, module, self.device) \
            if name == library.modules[0] else None
        if why_not is not None:
            return self._serve(library, name, f"the real package {why_not}")
        self.kept[name] = "the real package imports and works on the target"
        log.info("cudashim: %s is the real package (it works on %s)", name, self.device.type)
        # The import that asked has not finished; the module must not be in sys.modules
        # yet, or the import system would run it a second time from its own spec.
        return importlib.util.spec_from_loader(name, _ImportedLoader(sys.modules.pop(name)))

    def _real_spec(self, name: str):
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, None)
            if spec is not None:
                return spec
        return None

    def _serve(self, library: StandIn, name: str, why: str):
        _forget(name)                          # what a failed real import left behind
        self.served[name] = why
        log.info("cudashim: serving its %s stand-in for %r: %s", library.name, name, why)
        report = self.activation.report
        if report is not None:
            report.substituted(name, why)
        source = source_of(name)
        is_package = source.name == "__init__.py"
        return importlib.util.spec_from_file_location(
            name, source, submodule_search_locations=[str(source.parent)] if is_package else None)

    # --- metadata ----------------------------------------------------------------------
    def find_distributions(self, context=importlib.metadata.DistributionFinder.Context()):
        if not self.activation.live:
            return iter(())
        wanted = None if context.name is None else _normalized(context.name)
        found = []
        for library in {library.name: library for library in self.by_module.values()}.values():
            if wanted is not None and wanted != _normalized(library.distribution):
                continue
            main = library.modules[0]
            if main in self.served or (main not in self.kept and self._real_spec(main) is None):
                found.append(StandInDistribution(library))
        return iter(found)

    # --- deactivation ------------------------------------------------------------------
    def forget(self) -> None:
        """Drop the stand-ins from ``sys.modules``, and put back the real modules they
        displaced."""
        for name in self.served:
            _forget(name)
        sys.modules.update(self.displaced)


def _family(name: str) -> list:
    """``name`` and its submodules, as ``sys.modules`` holds them."""
    return [m for m in list(sys.modules) if m == name or m.startswith(name + ".")]


def _forget(name: str) -> None:
    for module in _family(name):
        del sys.modules[module]


# What a module-level name can hold of a library that is worth pointing elsewhere: modules,
# functions and classes. Constants are left alone: a small int is the same object everywhere.
_REBOUND_KINDS = (types.ModuleType, types.FunctionType, types.BuiltinFunctionType, type)


def _holding(modules: list, objects) -> list:
    """The modules in ``modules`` whose namespace holds one of ``objects``, by identity.

    Most of the thousand-odd modules imported hold none: their values are compared in C, by
    ``id`` (``cudashim._speedups.holding`` is the twin, at a third of the cost)."""
    wanted = {id(value) for value in objects}
    return [m for m in modules if isinstance(m, types.ModuleType)
            and not wanted.isdisjoint(map(id, vars(m).values()))]


def _references_to(displaced: Dict[str, types.ModuleType], stand_in: types.ModuleType,
                   holding=_holding) -> Iterator[Tuple[object, str, object]]:
    """(module, name, the stand-in's object) for every module-level name, in every module
    imported (and in the real modules behind cudashim's proxies), that holds a displaced
    module or one of its top-level functions or classes that the stand-in also has;
    ``holding`` is ``_holding`` or its compiled twin."""
    # id -> (a displaced module, or a function or class the library's module defines; where the
    # stand-in's counterpart is found: a module's name, or an attribute of the stand-in)
    real = {}
    for real_name, module in displaced.items():
        real[id(module)] = (module, real_name, None)
        if real_name == stand_in.__name__:
            for attribute, value in vars(module).items():
                if isinstance(value, _REBOUND_KINDS[1:]) and _defined_in(value, displaced):
                    real.setdefault(id(value), (value, None, attribute))
    counterparts = {}        # found only for what some module holds: most of a library is not

    def counterpart(key):
        if key not in counterparts:
            _, module_name, attribute = real[key]
            if attribute is not None:
                counterparts[key] = getattr(stand_in, attribute, None)
            else:
                counterparts[key] = stand_in if module_name == stand_in.__name__ \
                    else sys.modules.get(module_name)
        return counterparts[key]

    holders = [m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)]
    holders += [vars(m)["_cudashim_real"] for m in holders if "_cudashim_real" in vars(m)]
    # only a module that holds one of them is read name by name
    for holder in holding(holders, [entry[0] for entry in real.values()]):
        if holder.__name__.partition(".")[0] == stand_in.__name__ or holder in displaced.values():
            continue
        for attribute, value in list(vars(holder).items()):
            if id(value) in real and isinstance(value, _REBOUND_KINDS):
                ours = counterpart(id(value))
                if ours is not None and ours is not value:
                    yield holder, attribute, ours


def _defined_in(value, modules: Dict[str, types.ModuleType]) -> bool:
    """Whether a function or class was defined by one of ``modules`` (not imported into it)."""
    return getattr(value, "__module__", None) in modules


def enabled_libraries(settings) -> Iterable[str]:
    return [name for name in LIBRARIES if settings.substitutes(name)]

