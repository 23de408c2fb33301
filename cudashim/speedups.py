"""Which implementation of the hot wrappers runs: compiled or pure Python.

``cudashim._speedups`` (C, built by ``pip install`` where a compiler exists) holds twins of
the wrappers every call goes through: the device-argument rewriter, the caller check behind
``Tensor.is_cuda`` and the ``torch.cuda`` functions, ``Tensor.cuda`` and ``torch.device``.
Each behaves as its Python original; the pure_python setting (``--pure-python``,
``CUDASHIM_PURE_PYTHON=1``) runs the Python ones even where the compiled ones were built,
and they run anyway where the build found no compiler.
"""

from __future__ import annotations

from typing import Optional

from . import patches

NOT_BUILT = "the compiled fast path was not built: no C compiler at install time"

try:
    from . import _speedups as _compiled
    _not_loaded = None
except ImportError as exc:               # the Python fallback runs
    _compiled = None
    # Built for another table of twins (tables/compiled_twins.py) says so; else it was not built.
    _not_loaded = str(exc) if str(exc).startswith("cudashim._speedups") else NOT_BUILT


def built() -> bool:
    """Whether the compiled fast path was built for this interpreter."""
    return _compiled is not None


def _why_not(settings) -> Optional[str]:
    if settings.pure_python:
        return "the pure_python setting asks for it"
    if _compiled is None:
        return _not_loaded
    if patches.off_reason("compiled", settings) is not None:
        # torch.compile traces the compiled wrappers only through that group's patch.
        return "torch.compile could not trace the compiled ones: the 'compiled' patch group is off"
    return None


def chosen(settings):
    """The compiled module when it is built and the settings allow it, else None."""
    return _compiled if _why_not(settings) is None else None


# What the pure-Python fallback costs, measured against the compiled path on the 2-core test
# machine (BENCHMARKS.md, "The compiled fast path"; the kernels' row in "cudashim.kernels").
FALLBACK_COST = ("the same behaviour at +0.3 to +0.5 µs per wrapped call (device= arguments, "
                 ".cuda(), is_cuda, torch.cuda's functions) and about 6x slower 1-bit compression")


def fast_path(settings) -> str:
    """One line: whether the compiled fast path runs, and what its absence costs."""
    from .kernels import native
    if built() and native.unavailable() is None and _why_not(settings) is None:
        return "compiled fast path: on (cudashim._speedups, cudashim.kernels._native)"
    if not built() and _not_loaded != NOT_BUILT:
        return f"compiled fast path: off ({_not_loaded}): the pure-Python fallback runs, {FALLBACK_COST}"
    if not built():
        return ("compiled fast path: not built (no C compiler when cudashim was installed): the "
                f"pure-Python fallback runs, {FALLBACK_COST}; install gcc or clang, then cudashim again")
    reason = _why_not(settings) or native.unavailable()
    return f"compiled fast path: off ({reason}): the pure-Python fallback runs, {FALLBACK_COST}"


def describe(settings) -> str:
    """One line for doctor: which wrappers run, and why not the compiled ones."""
    reason = _why_not(settings)
    return "compiled (cudashim._speedups)" if reason is None else f"pure Python ({reason})"
