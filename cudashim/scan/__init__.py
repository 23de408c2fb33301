"""``cudashim scan``: what of a CUDA program will carry over to a target, read before it runs.

Python sources are parsed with ``ast``, never imported. Every CUDA usage is one finding:

- **handled**: the runtime redirects it (what it becomes on the target is named);
- **needs a change**: no runtime shim can catch it (a string compare with the real device),
  with the fix;
- **cannot run here**: native CUDA code (a CUDA C++ extension, CuPy or numba kernels, a CUDA
  library loaded by hand), with the way out;
- **runs differently**: it runs, on another path than on CUDA (a ``device.type == "cuda"``
  branch the target does not take, a triton kernel through Triton's interpreter), and the
  finding says which.

The scan follows the program: the files named, the Python files in folders named, and the
local modules they import. ``ScanResult.exit_status`` is 0 when nothing blocks the program,
1 when something needs a change or cannot run here (what blocks the run), 2 when an input
could not be read. Each finding names its rule (``catalog.py``).
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import os
import tokenize
from collections import Counter, deque
from pathlib import Path
from typing import Callable, Iterable, List, Optional

from .files import LocalModules, python_files
from .findings import BLOCKERS, CLASSES, Finding
from .rules import FileScanner
from .target import Target


# The version of ``--json``'s layout: it changes only when a key changes meaning or goes.
JSON_FORMAT = 2


@dataclasses.dataclass
class ScanResult:
    target: Target
    files: List[str]
    findings: List[Finding]
    errors: List[str]

    def counts(self) -> Counter:
        return Counter(finding.kind for finding in self.findings)

    def blocked_files(self) -> Counter:
        """{file: how many blockers} for the files with any."""
        return Counter(f.path for f in self.findings if f.kind in BLOCKERS)

    @property
    def exit_status(self) -> int:
        if self.errors:
            return 2
        return 1 if self.blocked_files() else 0

    def as_dict(self) -> dict:
        counts = self.counts()
        return {"format": JSON_FORMAT, "backend": self.target.name,
                "device_type": self.target.device_type, "device_count": self.target.device_count,
                "backend_chosen": self.target.how_chosen, "files_scanned": len(self.files),
                "summary": {kind: counts.get(kind, 0) for kind in CLASSES},
                "files_with_blockers": dict(sorted(self.blocked_files().items())),
                "errors": self.errors, "exit_status": self.exit_status,
                "findings": [finding.as_dict() for finding in self.findings]}


def scan(paths: Iterable[str] = (".",), backend: str = "auto",
         progress: Optional[Callable[[int, int], None]] = None,
         device_count: Optional[int] = None) -> ScanResult:
    """Scan ``paths`` (files or folders) for the backend named (``auto``: this machine's), for a
    run that sees ``device_count`` CUDA devices (None: the run's default)."""
    target = Target.named(backend, device_count)
    queue, queued, roots, errors = deque(), set(), [], []

    def enqueue(files: Iterable[Path]) -> None:
        for path in files:
            key = path.resolve()
            if key not in queued:
                queued.add(key)
                queue.append(path)

    for given in paths:
        path = Path(given)
        if path.is_dir():
            roots.append(path)
            enqueue(python_files(path))
        elif path.is_file():
            roots.append(path.parent)
            enqueue([path])
        else:
            errors.append(f"{given}: no such file or directory")
    modules = LocalModules(roots)
    files, findings = [], []
    while queue:
        path = queue.popleft()
        files.append(_shown(path))
        tree, source = _parse(path, errors)
        if tree is not None:
            is_local = functools.partial(modules.is_local, path)
            scanner = FileScanner(_shown(path), source, target, is_local)
            findings.extend(scanner.scan(tree))
            enqueue(_imported_files(scanner.import_statements, path, modules))
        if progress is not None:
            progress(len(files), len(queued))
    findings.sort(key=lambda f: (CLASSES.index(f.kind), f.path, f.line, f.column))
    return ScanResult(target, files, findings, errors)


def _shown(path: Path) -> str:
    """A path as the user would write it: relative to the working folder when under it."""
    try:
        shown = os.path.relpath(path)
    except ValueError:                               # another drive, on Windows
        return str(path)
    return str(path) if shown.startswith("..") else shown


def _parse(path: Path, errors: List[str]):
    try:
        with tokenize.open(path) as file:            # honours the file's encoding declaration
            source = file.read()
        return ast.parse(source, filename=str(path)), source
    except SyntaxError as exc:
        errors.append(f"{_shown(path)}:{exc.lineno}: cannot parse: {exc.msg}")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        errors.append(f"{_shown(path)}: cannot read: {exc}")
    return None, ""


def _imported_files(statements, importer: Path, modules: LocalModules) -> List[Path]:
    found: List[Path] = []
    for node in statements:
        if isinstance(node, ast.Import):
            for alias in node.names:
                found += modules.resolve(importer, alias.name)
        elif isinstance(node, ast.ImportFrom):
            found += modules.resolve(importer, node.module, node.level)
            for alias in node.names:           # "from pkg import module" reads pkg/module.py
                name = f"{node.module}.{alias.name}" if node.module else alias.name
                found += modules.resolve(importer, name, node.level)
    return found
