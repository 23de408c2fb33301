"""Which files a scan reads: the ones named, the Python files in folders named, and the
program's own modules they import (found beside them, never in site-packages)."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Iterable, Iterator, List, Optional

# Folders that hold no program source: version control, caches, environments, installs.
_NOT_SOURCE = frozenset({".git", ".hg", ".svn", "__pycache__", ".tox", ".nox", ".venv", "venv",
                         "node_modules", ".mypy_cache", ".pytest_cache", ".eggs",
                         "site-packages", "dist-packages"})
_INSTALLED = frozenset({"site-packages", "dist-packages"})


def python_files(folder: Path) -> Iterator[Path]:
    """The ``.py`` files under ``folder``, sorted, skipping environments and caches."""
    for directory, subdirectories, files in os.walk(folder):
        subdirectories[:] = sorted(
            name for name in subdirectories
            if name not in _NOT_SOURCE and not name.startswith(".")
            and not (Path(directory, name) / "pyvenv.cfg").exists())
        for name in sorted(files):
            if name.endswith(".py"):
                yield Path(directory, name)


class LocalModules:
    """Resolves import statements to the program's own files.

    A module is the program's when it lies beside the importing file (a script's folder is
    the first entry of ``sys.path``), or under one of the folders the scan was given.
    """

    def __init__(self, roots: Iterable[Path]):
        self.roots = tuple(dict.fromkeys(root.resolve() for root in roots))

    def resolve(self, importer: Path, module: Optional[str], level: int = 0) -> List[Path]:
        """The files ``from <level dots><module> import ...`` (or ``import module``) reads."""
        parts = module.split(".") if module else []
        folder = _folder(importer)
        if level:
            base = folder
            for _ in range(level - 1):
                base = base.parent
            found = _module_file(base, tuple(parts))
            return [found] if found else []
        for base in (folder, *self.roots):
            found = _module_file(base, tuple(parts))
            if found is not None:
                return [found]
        return []

    def is_local(self, importer: Path, module: Optional[str], level: int = 0) -> bool:
        return level > 0 or bool(self.resolve(importer, module, level))


@functools.lru_cache(maxsize=None)
def _folder(path: Path) -> Path:
    return path.resolve().parent


@functools.lru_cache(maxsize=None)
def _module_file(base: Path, parts: tuple) -> Optional[Path]:
    if not parts:
        init = base / "__init__.py"
        return init if init.is_file() else None
    path = base.joinpath(*parts)
    for candidate in (path.with_suffix(".py"), path / "__init__.py"):
        if candidate.is_file() and not _INSTALLED.intersection(candidate.parts):
            return candidate
    return None
