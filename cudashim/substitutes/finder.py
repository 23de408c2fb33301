"""The import hook that serves a stand-in under a CUDA-only library's own name.

``SubstituteFinder`` sits first on ``sys.meta_path`` while cudashim is active. At the first
import of a library's top-level name it decides once:

1. the real package is not installed: the stand-in is served;
2. it is installed: it is imported as Python would, then tried on the target
   (``probes.py``); if the import raises or the try fails, everything it left in
   ``sys.modules`` is removed and the stand-in is served; otherwise the real module is
   handed to the import that asked, untouched.

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
from typing import Dict, Iterable

from . import LIBRARIES, Library, probes, provides, source_of
from ._refuse import refusal

log = logging.getLogger(__name__)


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


class StandInDistribution(importlib.metadata.Distribution):
    """The metadata a stand-in answers to: its distribution name, a version with the
    ``+cudashim`` local label, and the import names it provides."""

    def __init__(self, library: Library):
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

    def __init__(self, library: Library):
        self.library = library

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        from ..scan.libraries import CUDA_ONLY_LIBRARIES       # the one table of ways out

        way_out = CUDA_ONLY_LIBRARIES[self.library.name][1]
        raise refusal(module.__name__, f"it provides {self.library.substituted}; instead, {way_out}")


class SubstituteFinder(importlib.abc.MetaPathFinder):
    def __init__(self, activation, enabled: Iterable[str]):
        self.activation = activation
        self.device = activation.backend.target_device(0)
        self.by_module: Dict[str, Library] = {module: LIBRARIES[name] for name in enabled
                                              for module in LIBRARIES[name].modules}
        self.decisions: Dict[str, importlib.machinery.ModuleSpec] = {}
        self.served: Dict[str, str] = {}       # import name -> why the stand-in was served
        self.kept: Dict[str, str] = {}         # import name -> why the real package was kept
        self._trying: set = set()              # names being imported for real, in this finder
        self._lock = threading.RLock()

    # --- imports -----------------------------------------------------------------------
    def find_spec(self, fullname, path=None, target=None):
        top, dot, _ = fullname.partition(".")
        if dot:                                # a submodule follows its parent's __path__...
            if top in self.served and not provides(fullname):
                return importlib.util.spec_from_loader(fullname, _RefusingLoader(self.by_module[top]))
            return None                        # ...unless the stand-in lacks it
        library = self.by_module.get(fullname)
        if library is None or fullname in self._trying or not self.activation.live:
            return None
        with self._lock:
            spec = self.decisions.get(fullname)
            if spec is None:
                spec = self.decisions[fullname] = self._decide(library, fullname)
            return spec

    def _decide(self, library: Library, name: str):
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
        why_not = probes.why_not_working(library.name, module, self.device) \
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

    def _serve(self, library: Library, name: str, why: str):
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
    def remove(self) -> None:
        """Leave ``sys.meta_path``, and drop the stand-ins from ``sys.modules`` so that a
        later import meets the real package (or its absence) again."""
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        for name in self.served:
            _forget(name)


def _forget(name: str) -> None:
    for module in [m for m in sys.modules if m == name or m.startswith(name + ".")]:
        del sys.modules[module]


def enabled_libraries(settings) -> Iterable[str]:
    return [name for name in LIBRARIES if settings.substitutes(name)]

