"""Run a program the way ``python`` would, with cudashim active in it and its children.

``script.py args``, ``-m module args`` and ``-c code args`` get python's ``sys.argv``,
``__name__ == "__main__"``, ``sys.path[0]``, exit status and tracebacks. Children see
``CUDASHIM_ACTIVATE=1`` and the hook folder on ``PYTHONPATH``.
"""

from __future__ import annotations

import builtins
import functools
import importlib.machinery
import os
import runpy
import sys
import types
import zipfile
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


def image_environment(settings) -> dict:
    """What an image needs to shim every Python it starts: the hook and the switch, and only
    the settings that differ from their defaults (a default pinned in an image would stop it
    from following a newer cudashim's)."""
    from ._settings import load
    defaults = load(environ={}).to_environ()
    return {name: value for name, value in child_environment(settings, existing_pythonpath="").items()
            if defaults.get(name) != value}


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
    """kind is "script", "module" or "code". Runs the program in a new ``__main__`` module, as
    python does; returns normally or raises (python's own handling then prints the error and
    sets the exit status: 1, or death by SIGINT for an uncaught KeyboardInterrupt)."""
    main = types.ModuleType("__main__")       # as the interpreter makes it at start-up
    main.__dict__.update(__builtins__=builtins, __annotations__={},
                         __loader__=importlib.machinery.BuiltinImporter)
    sys.modules["__main__"] = main
    try:
        if kind == "script" and not _runs_as_a_folder(target):
            path = os.path.abspath(target)
            sys.argv = [target] + args
            sys.path[0] = os.path.dirname(os.path.realpath(target))
            main.__dict__.update(__file__=path, __cached__=None,
                                 __loader__=importlib.machinery.SourceFileLoader("__main__", path))
            with open(path, "rb") as source:
                code = compile(source.read(), path, "exec", dont_inherit=True)
            exec(code, main.__dict__)
        elif kind == "script":                   # a folder or zip file with a __main__.py
            sys.argv = [target] + args
            sys.path[0] = os.path.abspath(target)
            runpy._run_module_as_main("__main__", alter_argv=False)
        elif kind == "module":
            sys.argv = [target] + args               # runpy replaces argv[0] with the file
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(target, alter_argv=True)
        else:
            sys.argv = ["-c"] + args
            sys.path[0] = ""
            exec(compile(target, "<string>", "exec", dont_inherit=True), main.__dict__)
    except SystemExit:
        raise
    except BaseException:
        # Python prints it through sys.excepthook when it leaves the interpreter's main: from
        # the program's first frame on, as python would show it.
        sys.excepthook = functools.partial(_from_the_program_on, sys.excepthook)
        raise


def _runs_as_a_folder(target: str) -> bool:
    return os.path.isdir(target) or zipfile.is_zipfile(target)


def _from_the_program_on(excepthook, kind, value, tb):
    tb = _user_traceback(tb)
    if isinstance(value, BaseException):       # python prints the exception's own traceback
        value = value.with_traceback(tb)
    excepthook(kind, value, tb)


def _user_traceback(tb):
    """Drop the launcher's and runpy's frames, so the traceback reads as under python; none
    is left where the program never ran (a syntax error, which python shows without one)."""
    while tb is not None:
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith(str(PACKAGE_DIR)) or os.path.basename(filename) == "runpy.py"
                or filename.startswith("<frozen runpy")):
            return tb
        tb = tb.tb_next
    return None
