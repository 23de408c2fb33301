"""The report: which CUDA APIs a program used, how often, what each became, and where.

Counting happens only when the report is on; patches are built with or without it, so a
program without ``--report`` pays nothing for it.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
import threading
from pathlib import Path
from typing import Dict, Optional

from . import job_layout
from .errors import ReportPathError

_SKIP_DIRS = tuple(str(Path(p).resolve()) + os.sep for p in (
    Path(__file__).parent,                                   # cudashim itself
))


def _torch_dir() -> Optional[str]:
    torch = sys.modules.get("torch")
    return str(Path(torch.__file__).parent.resolve()) + os.sep if torch else None


class Report:
    def __init__(self, backend_name: str):
        self.backend_name = backend_name
        self.entries: Dict[str, dict] = {}
        self.askers: Dict[str, Dict[str, str]] = {}      # question -> {module: what it heard}
        self.stand_ins: Dict[str, str] = {}              # library -> why its stand-in was served
        self.kernels: Dict[str, dict] = {}               # Triton kernel -> its interpreted launches
        self._lock = threading.Lock()
        self._skip = _SKIP_DIRS + tuple(d for d in (_torch_dir(),) if d)

    def count(self, api: str, became) -> None:
        entry = self.entries.get(api)
        if entry is None:
            with self._lock:
                entry = self.entries.setdefault(
                    api, {"calls": 0, "became": str(became), "first_call": self._call_site()})
        entry["calls"] += 1

    def heard(self, question: str, module: str, honest: bool) -> None:
        """Record that ``module`` (its top-level package) asked ``question`` and heard the
        truth or the compatible answer (the caller policy's decision)."""
        top = module.partition(".")[0] or "?"
        answers = self.askers.get(question)
        if answers is None:
            with self._lock:
                answers = self.askers.setdefault(question, {})
        answers.setdefault(top, "the truth" if honest else "the compatible answer")

    def substituted(self, library: str, why: str) -> None:
        """Record that ``library``'s import was served by cudashim's stand-in."""
        self.stand_ins[library] = why

    def interpreted(self, kernel: str, target: str, seconds: float) -> None:
        """Record one launch of the Triton kernel ``kernel``, run through Triton's interpreter on
        ``target`` in ``seconds``."""
        entry = self.kernels.get(kernel)
        if entry is None:
            with self._lock:
                entry = self.kernels.setdefault(kernel, {"launches": 0, "seconds": 0.0, "on": target})
        with self._lock:
            entry["launches"] += 1
            entry["seconds"] += seconds

    def _call_site(self) -> str:
        """file:line of the first frame outside cudashim, torch and runpy (the user's code)."""
        frame = sys._getframe(2)
        while frame is not None:
            filename = frame.f_code.co_filename
            if not self._is_internal(filename):
                return f"{filename}:{frame.f_lineno}"
            frame = frame.f_back
        return "?"

    def _is_internal(self, filename: str) -> bool:
        if filename.startswith("<frozen"):
            return True
        if filename.startswith("<"):                 # "<string>": code given with -c
            return False
        return (os.path.basename(filename) == "runpy.py"
                or os.path.realpath(filename).startswith(self._skip))

    # --- output -----------------------------------------------------------------------
    def as_dict(self) -> dict:
        return {"backend": self.backend_name, "rank": job_layout.rank(), "pid": os.getpid(),
                "apis": {k: dict(v) for k, v in sorted(self.entries.items())},
                "asked": {k: dict(sorted(v.items())) for k, v in sorted(self.askers.items())},
                "substituted": dict(sorted(self.stand_ins.items())),
                "interpreted": {k: dict(v) for k, v in sorted(self.kernels.items())}}

    def render(self) -> str:
        rank = job_layout.rank()
        title = f"cudashim report ({self.backend_name} backend" + (f", rank {rank})" if rank else ")")
        if not self.entries and not self.stand_ins and not self.kernels:
            return f"{title}: the program used no CUDA API\n"
        rows = [("CUDA API", "calls", "became", "first call")]
        for api, e in sorted(self.entries.items(), key=lambda kv: (-kv[1]["calls"], kv[0])):
            rows.append((api, str(e["calls"]), e["became"], e["first_call"]))
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = [title]
        for r in rows:
            lines.append("  ".join(r[i].ljust(widths[i]) if i < 3 else r[i] for i in range(4)))
        if self.stand_ins:
            lines.append("CUDA-only libraries served by cudashim's stand-in:")
            lines.extend(f"  {library}: {why}" for library, why in sorted(self.stand_ins.items()))
        if self.kernels:
            lines.append("Triton kernels run by Triton's interpreter (no Triton backend for the target):")
            for kernel, k in sorted(self.kernels.items(), key=lambda kv: -kv[1]["seconds"]):
                lines.append(f"  {kernel}: {k['launches']} launches on {k['on']}, {k['seconds']:.3f} s")
        if self.askers:
            lines.append("who asked, and what they heard:")
            for question, answers in sorted(self.askers.items()):
                heard = ", ".join(f"{module}: {answer}" for module, answer in sorted(answers.items()))
                lines.append(f"  {question}  {heard}")
        return "\n".join(lines) + "\n"

    def write(self, json_path: Optional[str], print_table: bool) -> None:
        """At exit: the table on standard error, the JSON where asked. A file that can no
        longer be written (its folder removed meanwhile) costs one line, never a traceback."""
        if print_table:
            sys.stderr.write(self.render())
        if json_path:
            path = rank_path(json_path)
            try:
                Path(path).write_text(json.dumps(self.as_dict(), indent=2) + "\n")
            except OSError as exc:
                sys.stderr.write(f"cudashim: the report could not be written to {path}: "
                                 f"{exc.strerror or exc}\n")

    def write_at_exit(self, json_path: Optional[str], print_table: bool) -> None:
        atexit.register(self.write, json_path, print_table)


def check_writable(json_path: str) -> None:
    """Raise ReportPathError (one line) now, at start-up, if the report's JSON file cannot be
    written at exit: its folder must exist (none is made), and the file be writable."""
    path = Path(rank_path(json_path))
    folder = path.parent
    if path.is_dir():
        problem = "it is a folder"
    elif not folder.is_dir():
        problem = f"there is no folder {folder}"
    elif not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        problem = "permission denied"
    else:
        return
    raise ReportPathError(f"report_json={json_path}: cannot write the report to {path}: {problem}")


def rank_path(path: str) -> str:
    """``report.json`` becomes ``report.rank3.json`` in rank 3, so ranks do not overwrite."""
    rank = job_layout.rank()
    if rank is None:
        return path
    p = Path(path)
    return str(p.with_name(f"{p.stem}.rank{rank}{p.suffix}"))
