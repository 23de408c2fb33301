"""Filling a kernel's dtype gap: compute in a wider dtype the target supports, cast back.

CUDA kernels accept some dtypes the CPU's refuse (``torch.abs`` of a bool tensor, half
precision FFTs, ``histc`` of integers). In a filled function, a call whose tensor arguments
are in a gap dtype has them widened, the op computes, and each result that came out in the
wide dtype goes back to the dtype CUDA returns; any other call goes to the op as it came.

Which calls are in the gap: reading a tensor's dtype costs about 60 ns, as much as the whole
budget of a call outside the gap, and most programs never call a function in its gap. So a
filled function first calls the op as it came, and looks at dtypes only where the op refused
(the CPU refuses its gap dtypes before it writes anything); a refused call costs 25-40 µs.
Once the function has been called in its gap, the program is one that does so, and from
then on it looks at the dtypes first. Only functions with a gap are filled.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .out_tensors import written_to

# gap dtype -> the dtype it computes in on the CPU
_WIDER = {
    torch.bool: torch.uint8,          # abs, trace, softsign: the same values, an integer kernel
    torch.float16: torch.float32,
    torch.bfloat16: torch.float32,
    **{dtype: torch.float64 for dtype in (torch.uint8, torch.int8, torch.int16, torch.int32,
                                          torch.int64)},      # histc counts in floating point
}
# gap dtype -> {dtype a wide result comes in: the dtype CUDA gives it}
_BACK = {
    torch.float16: {torch.float32: torch.float16, torch.complex64: torch.complex32},
    torch.bfloat16: {torch.float32: torch.bfloat16},
}
# Gaps left on purpose, and why.
NOT_FILLED = {
    torch.complex32: "ComplexHalf is experimental in torch, and its gaps are in hot ops (sum, "
                     "pow, div, exp, ...) that would all pay for a wrapper",
}
NO_WIDER_DTYPE = "the CPU has no wider dtype that computes it"


def compute_dtype(dtype) -> Optional[torch.dtype]:
    """The dtype a gap in ``dtype`` computes in; None where it is not filled."""
    return _WIDER.get(dtype)


def why_not_filled(dtype) -> str:
    return NOT_FILLED.get(dtype, NO_WIDER_DTYPE)


def filled(function, dtypes, inplace_of=None):
    """``function`` that computes calls in one of ``dtypes`` in a wider dtype. For an
    in-place method, ``inplace_of`` is its out-of-place form: it computes, and the result is
    copied into the tensor. The fill's ``widened`` computes a call known to be in the gap
    (the compiled twin calls it once the op refused)."""
    dtypes = frozenset(dtypes)

    def widened(*args, **kwargs):
        gap = _gap_in(args, kwargs, dtypes)
        wide = _WIDER[gap]
        widened_args = [_widen(a, gap, wide) for a in args]
        widened_kwargs = {k: _widen(v, gap, wide) for k, v in kwargs.items()}
        if inplace_of is not None:
            result = inplace_of(*widened_args, **widened_kwargs)
            return args[0].copy_(result)
        out = kwargs.get("out")
        if isinstance(out, torch.Tensor):              # torch.abs(flags, out=buffer)
            del widened_kwargs["out"]
            return written_to(out, _narrow(function(*widened_args, **widened_kwargs), gap, wide))
        return _narrow(function(*widened_args, **widened_kwargs), gap, wide)

    gap_seen = False

    @functools.wraps(function)
    def fill(*args, **kwargs):
        nonlocal gap_seen
        if gap_seen:
            if _gap_in(args, kwargs, dtypes) is None:
                return function(*args, **kwargs)
            return widened(*args, **kwargs)
        try:
            return function(*args, **kwargs)
        except Exception:
            if _gap_in(args, kwargs, dtypes) is None:
                raise                          # not the gap: the op's own error, as it was
        gap_seen = True
        return widened(*args, **kwargs)

    fill.cudashim_gap_dtypes = dtypes
    fill.widened = widened
    return fill


def _gap_in(args, kwargs, dtypes):
    for value in args:
        if isinstance(value, torch.Tensor) and value.dtype in dtypes:
            return value.dtype
    for value in kwargs.values():
        if isinstance(value, torch.Tensor) and value.dtype in dtypes:
            return value.dtype
    return None


def _widen(value, gap, wide):
    return value.to(wide) if isinstance(value, torch.Tensor) and value.dtype == gap else value


def _narrow(result, gap, wide):
    back = {wide: gap, **_BACK.get(gap, {})}
    if isinstance(result, torch.Tensor):
        target = back.get(result.dtype)
        return result if target is None else result.to(target)
    if isinstance(result, (tuple, list)) and not hasattr(result, "_fields"):
        return type(result)(_narrow(item, gap, wide) for item in result)
    if isinstance(result, tuple):                                  # a named tuple (torch.return_types)
        return type(result)(*(_narrow(item, gap, wide) for item in result))
    return result
