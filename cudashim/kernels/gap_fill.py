"""Filling a kernel's dtype gap: compute in a wider dtype the target supports, cast back.

CUDA kernels accept some dtypes the CPU's refuse (``torch.abs`` of a bool tensor, half
precision FFTs, ``histc`` of integers). A filled function checks its tensor arguments: in
a gap dtype, they are widened, the op computes, and each result that came out in the wide
dtype goes back to the dtype CUDA returns; any other call goes straight to the op, paying
one scan of its arguments. Only functions with a gap are filled.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

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
    copied into the tensor."""
    dtypes = frozenset(dtypes)

    @functools.wraps(function)
    def fill(*args, **kwargs):
        # The common call passes its tensors positionally, outside the gap: one look at
        # each argument's dtype (a C attribute on tensors), no other call.
        for value in args:
            if getattr(value, "dtype", None) in dtypes:
                break
        else:
            if not kwargs:
                return function(*args)
        gap = _gap_in(args, kwargs, dtypes)
        if gap is None:
            return function(*args, **kwargs)
        wide = _WIDER[gap]
        widened_args = [_widen(a, gap, wide) for a in args]
        widened_kwargs = {k: _widen(v, gap, wide) for k, v in kwargs.items()}
        if inplace_of is not None:
            result = inplace_of(*widened_args, **widened_kwargs)
            return args[0].copy_(result)
        return _narrow(function(*widened_args, **widened_kwargs), gap, wide)

    fill.cudashim_gap_dtypes = dtypes
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
