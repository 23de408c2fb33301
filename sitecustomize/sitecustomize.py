"""cudashim's start-up hook: put this folder on PYTHONPATH to shim every Python started.

It imports no torch: when CUDASHIM_ACTIVATE=1 it only arms a post-import hook, so a Python
that never imports torch pays next to nothing. It first runs the next sitecustomize on
sys.path (an image's own), and never breaks interpreter start-up: any failure is a warning.
"""

import os
import sys


def _run_next_sitecustomize():
    here = os.path.dirname(os.path.abspath(__file__))
    ours = sys.modules.pop("sitecustomize", None)
    saved_path = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    try:
        import importlib
        importlib.import_module("sitecustomize")
    except ImportError as exc:
        if exc.name != "sitecustomize":
            _warn(f"the next sitecustomize failed: {exc!r}")
    except Exception as exc:
        _warn(f"the next sitecustomize failed: {exc!r}")
    finally:
        added = [p for p in sys.path if p not in saved_path]   # keep what the next one added
        sys.path[:] = saved_path + added
        if ours is not None:
            sys.modules["sitecustomize"] = ours


def _activate():
    if os.environ.get("CUDASHIM_ACTIVATE") != "1":
        return
    try:
        import cudashim
        cudashim.activate()
    except Exception as exc:
        _warn(f"cudashim is not active in this interpreter: {exc}")


def _warn(message):
    import warnings
    try:
        from cudashim.errors import CudashimWarning as category
    except Exception:              # cudashim itself is what failed to import
        category = RuntimeWarning
    # Start-up has no line of the program to point at, and this file's own line says nothing.
    warnings.warn_explicit(message, category, filename="<cudashim start-up hook>", lineno=0)


_run_next_sitecustomize()
_activate()
