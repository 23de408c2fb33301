"""Run a program the way ``python`` would, with cudashim active in it and its children.

``script.py args``, ``-m module args`` and ``-c code args`` get python's ``sys.argv``,
``__name__ == "__main__"``, ``sys.path[0]``, exit status and tracebacks. Children see
``CUDASHIM_ACTIVATE=1`` and the hook folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import runpy
import sys
import types
from pathlib import Path

from . import _settings

PACKAGE_DIR = Path(__file__).resolve().parent


def hook_dir() -> Path:
    """The folder holding only sitecustomize.py: inside the package once installed,
    ``sitecustomize/`` beside the package in a source checkout."""
    installed = PACKAGE_DIR / "_sitecustomize"
    return installed if (installed / "sitecustomize.py").exists() else PACKAGE_DIR.parent / "sitecustomize"


def child_environment(settings, existing_pythonpath: str) -> dict:
    """The variables that make a Python come up shimmed with these settings."""
    entries = [str(hook_dir())]
    if PACKAGE_DIR.parent.name not in ("site-packages", "dist-packages"):
        entries.append(str(PACKAGE_DIR.parent))      # a source checkout: children import it too
    existing = [p for p in existing_pythonpath.split(os.pathsep) if p]
    return {"PYTHONPATH": os.pathsep.join(entries + [p for p in existing if p not in entries]),
            _settings.ENV_ACTIVATE: "1", **settings.to_environ()}


def export_to_children(settings) -> None:
    """Make every Python started from here come up shimmed with the same settings."""
    os.environ.update(child_environment(settings, os.environ.get("PYTHONPATH", "")))


def check_script(path: str) -> None:
    """Fail as python does for a script that cannot be opened (status 2)."""
    if not os.path.exists(path):
        sys.stderr.write(f"{sys.executable}: can't open file {os.path.abspath(path)!r}: "
                         "[Errno 2] No such file or directory\n")
        raise SystemExit(2)


def run(kind: str, target: str, args: list) -> None:
    """kind is "script", "module" or "code". Returns normally or raises SystemExit."""
    try:
        if kind == "script":
            sys.argv = [target] + args
            sys.path[0] = os.path.dirname(os.path.realpath(target))
            runpy.run_path(target, run_name="__main__")
        elif kind == "module":
            sys.argv = [target] + args                # runpy replaces argv[0] with the file
            sys.path[0] = os.getcwd()
            runpy.run_module(target, run_name="__main__", alter_sys=True)
        else:
            sys.argv = ["-c"] + args
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(target, "<string>", "exec"), main.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:
        trimmed = _user_traceback(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(trimmed), trimmed)
        raise SystemExit(130 if isinstance(exc, KeyboardInterrupt) else 1) from None


def _user_traceback(tb):
    """Drop the launcher's and runpy's frames, so the traceback reads as under python."""
    first = tb
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith(str(PACKAGE_DIR)) or os.path.basename(filename) == "runpy.py"
                or filename.startswith("<frozen runpy")):
            return tb
        tb = tb.tb_next
    return first
