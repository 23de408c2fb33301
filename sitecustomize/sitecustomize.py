"""cudashim's start-up hook: put this folder on PYTHONPATH to shim every Python started.

A Python that never imports torch pays next to nothing: when CUDASHIM_ACTIVATE=1 the hook
only puts a finder on ``sys.meta_path`` that waits for the first lookup of ``torch`` (or of a
library cudashim serves a stand-in for, which imports torch itself), and imports and activates
cudashim then (most Pythons of an image are tools that never import torch, and importing
cudashim costs tens of milliseconds). It first runs the next sitecustomize on sys.path (an
image's own), and never breaks interpreter start-up or an import: any failure is a warning.
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


class _ActivateAtTorch:
    """A meta path finder that finds nothing: at the first lookup of ``torch`` it leaves
    ``sys.meta_path``, activates cudashim (which, torch not being imported yet, arms its
    post-import hook) and answers with the spec the finders after it give, so that a finder
    the activation put first still sees this import."""

    # torch, and the top-level names of the libraries cudashim serves stand-ins for that import
    # torch themselves (cudashim/tables/libraries.py; a test keeps the two the same): a program
    # sorted by isort imports apex and flash_attn before torch. Not read from cudashim: importing
    # it costs tens of milliseconds, in every Python.
    NAMES = frozenset(("torch", "flash_attn", "xformers", "apex", "amp_C"))

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.NAMES:
            return None
        try:
            sys.meta_path.remove(self)
        except ValueError:             # another thread got here first
            return None
        _activate()
        import importlib.util
        try:
            return importlib.util.find_spec(fullname)
        except (ImportError, ValueError):
            return None


def _arm():
    if os.environ.get("CUDASHIM_ACTIVATE") != "1":
        return
    if "torch" in sys.modules:         # an earlier start-up hook imported it
        _activate()
    else:
        sys.meta_path.insert(0, _ActivateAtTorch())


def _activate():
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
_arm()
