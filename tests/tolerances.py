"""Tolerances derived from the dtype and the computation, for results that two correct
evaluations may round differently: compiled code against eager, one CPU's kernels against
another's (AVX-512 sums in another order than AVX2), a target's kernels against the host's.

Summing ``n`` terms in float arithmetic errs by at most ``(n - 1) * eps`` of the sum of their
magnitudes, in any order, so two orders differ by at most twice that; each further reduction a
result passes through (a layer) can add as much again. Values of order one are assumed, which is
what the tests' small networks produce; ``atol`` covers results that cancel to near zero.
"""

import torch


def reordered(dtype: torch.dtype, terms: int, reductions: int = 1) -> dict:
    """``assert_close`` keywords within which two evaluations of the same computation in ``dtype``
    agree when each of its ``reductions`` chained reductions of ``terms`` terms sums in another
    order."""
    bound = 2 * max(terms - 1, 1) * reductions * torch.finfo(dtype).eps
    return {"rtol": bound, "atol": bound}
