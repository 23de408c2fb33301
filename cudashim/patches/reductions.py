"""Long float reductions as exact as CUDA's, where the target computes with the host's kernels.

torch's CPU kernels for vector norms (``torch.linalg.vector_norm``, ``torch.norm`` and
``Tensor.norm``, ``torch.linalg.norm``'s vector cases, ``torch._foreach_norm`` under
``clip_grad_norm_``, ``torch.dist``, ``cosine_similarity``) accumulate each vector lane's share of the input in one
float32 running sum, and BLAS's ``dot``, ``vdot`` and ``mv`` do the same along the inner
dimension. Over millions of elements that drifts: against float64, a 2-norm of 2**24 values
is off by 1e-4 to 5e-4, of 2**26 by 2e-3 to 4e-3, where CUDA's tree reductions stay near
1e-7. A CUDA
program that checks a flattened gradient's norm against a reference (DeepSpeed's 1-bit
backend tests), or clips by it, would see the CPU's drift. On the CPU backend such calls,
past a length where the drift shows, are summed as CUDA's reduction keeps them exact.

- Where no gradient is recorded through a float32 input, the compiled host kernels
  (``native.long_sums``) sum whole 1-norms, distances and cosine similarities in one pass: terms
  in float32 over stretches of 256, the stretches in double. They take 0.1-0.8x torch's own
  time (cosine similarities make no normalized copies).
- Everything else is split into blocks: torch's kernel reduces each block, then the blocks'
  results. That is other orders and 2-norms, float16 and bfloat16 inputs, a gradient to record,
  norms of several rows, and ``dot``, ``vdot`` and ``mv``. A norm is the norm of its blocks'
  norms (for any finite nonzero order), a dot the sum of its blocks' dots; both stay
  differentiable. The blocked 2-norm runs faster than torch's single pass (0.6-0.9x), other
  orders, dots and ``mv`` at 1.05-1.15x. These keep torch's kernels because they run on torch's
  own threads: the compiled kernels' second thread shares its core with torch's pool, whose
  workers spin for a while after each op. So one core streams a 2-norm, two inputs or several
  rows slower than torch's threads do.

``benchmarks/reductions.py`` measures both against torch's own calls.

Shorter calls, dtypes torch does not reduce in float32, orders 0 and ±inf (exact as they
are), ``out=`` and float64 ``dtype=`` arguments, and reductions whose elements are not one
contiguous run go to torch unchanged, after one check.
"""

from __future__ import annotations

import functools
import math

import torch

from ..kernels import native
from ..patching.rewriter import compiled_twin
from ..patching.signatures import by_position

# A norm over at least this many elements per result is blocked: below it torch's drift is
# within a few times CUDA's (about 5e-7 at 2**18), and the blocks' extra kernels would cost
# more than 1.2x torch's single one (1.3-1.7x at 2**18, 0.9-1.1x at 2**20, measured here).
NORM_BLOCKED_FROM = 2 ** 20
NORM_BLOCK = 4096
# Dots drift later (2e-7 at 2**22, 7e-7 at 2**24, 4e-4 for mv at 2**26) and cost more blocked
# (1.2-1.4x at 2**22, 1.1x from 2**23): fewer, longer blocks (a block of 2**20 is within 3e-7
# of float64 on its own, and keeps BLAS's threads busy).
DOT_BLOCKED_FROM = 2 ** 23
DOT_BLOCK = 2 ** 20
MV_BLOCK = 2 ** 18             # BLAS's gemv drifts sooner than its dot (4e-6 at 2**20)
# torch's dist drifts as its norm does (1.4e-5 at 2**20). The compiled kernel sums it from
# NORM_BLOCKED_FROM; elsewhere (another order or dtype, a gradient to record) it is blocked by
# calls to itself: blocks of 2**16 keep to 3e-7; their calls cost 1.2x torch's at 2**22, 1.5x
# at 2**21 (left to torch there), 0.6x at 2**24.
DIST_BLOCKED_FROM = 2 ** 22
DIST_BLOCK = 2 ** 16

# The dtypes torch's CPU kernels reduce with float32 accumulators.
_FLOAT32_ACCUMULATED = (torch.float32, torch.float16, torch.bfloat16)
_PLAIN = (torch.Tensor, torch.nn.Parameter)
BLOCKED = "reduced in blocks (CUDA's accuracy)"


def install(activation):
    if not activation.backend.computes_with_host_kernels:
        return
    count, compiled = activation.count, activation.compiled
    vector_norm = torch.linalg.vector_norm          # torch's own, which every norm here blocks
    # (owner, name, the Python wrapper, the shortest leading tensor it may block, how many
    # leading positionals that is read off)
    for owner, name, make, length, leading in (
            (torch.linalg, "vector_norm", _vector_norm, NORM_BLOCKED_FROM, 1),
            (torch.linalg, "norm", _linalg_norm, NORM_BLOCKED_FROM, 1),
            (torch, "_foreach_norm", _foreach_norm, None, 0),
            (torch, "dist", _dist, NORM_BLOCKED_FROM, 2),
            (torch, "cosine_similarity", _cosine_similarity, NORM_BLOCKED_FROM, 1),
            (torch.nn.functional, "cosine_similarity", _cosine_similarity, NORM_BLOCKED_FROM, 1),
            *((owner, name, _dot, DOT_BLOCKED_FROM, 2) for owner in (torch, torch.Tensor)
              for name in ("dot", "vdot")),
            *((owner, "mv", _mv, DOT_BLOCKED_FROM, 2) for owner in (torch, torch.Tensor))):
        api = f"{getattr(owner, '__name__', owner)}.{name}"
        python = functools.partial(_taking_keywords, functools.partial(make, api, count, vector_norm),
                                   max(leading, 1))
        activation.replace(owner, name, python if compiled is None or not leading
                           else functools.partial(_gated, compiled, python, length, leading))


def _taking_keywords(make, count, original):
    """``make(original)``, whose wrapper reads its first ``count`` arguments by position, taking
    them by the keywords torch's function takes them by as well (``torch.dot(input=a,
    tensor=b)``, ``torch.linalg.vector_norm(input=x)``: a TypeError otherwise)."""
    wrapper = make(original)

    @functools.wraps(original)
    def taking_keywords(*args, **kwargs):
        if kwargs and len(args) < count:
            args, kwargs = by_position(original, count, args, kwargs)
        return wrapper(*args, **kwargs)
    return taking_keywords


def _gated(compiled, make, length, leading, original):
    """The Python wrapper behind its compiled gate, which sends calls whose leading tensors
    are all shorter than ``length`` to torch's function without a Python frame."""
    python = make(original)
    return compiled_twin(compiled.LengthGate(original, python, length, leading, torch._C.TensorBase),
                         python)


# --- norms --------------------------------------------------------------------------------
def _reduced_run(x, dim):
    """(elements each result reduces, dimensions reduced) where those elements are one
    contiguous run of a contiguous tensor (all of it, or its trailing dimensions); else None."""
    if not x.is_contiguous():
        return None
    ndim = x.dim()
    if dim is None:
        return x.numel(), ndim
    if dim.__class__ is int and ndim and (dim == -1 or dim == ndim - 1):    # the common call
        return x.shape[-1], 1
    dims = (dim,) if isinstance(dim, int) else dim
    if not isinstance(dims, (tuple, list)) or not dims or not ndim \
            or not all(isinstance(d, int) and -ndim <= d < ndim for d in dims):
        return None
    reduced = sorted({d % ndim for d in dims})
    if reduced != list(range(ndim - len(reduced), ndim)):
        return None
    return math.prod(x.shape[ndim - len(reduced):]), len(reduced)


def _blockable_norm(x, ord, dim, dtype):
    """(run, dimensions reduced) where this norm is one to block; else None."""
    if type(x) not in _PLAIN or x.dtype not in _FLOAT32_ACCUMULATED or x.numel() < NORM_BLOCKED_FROM \
            or not x.is_cpu or (dtype is not None and dtype not in _FLOAT32_ACCUMULATED) \
            or isinstance(ord, bool) or not isinstance(ord, (int, float)) or ord == 0 \
            or not math.isfinite(ord):
        return None
    reduced = _reduced_run(x, dim)
    return reduced if reduced is not None and reduced[0] >= NORM_BLOCKED_FROM else None


def blocked_norm(vector_norm, x, ord, reduced, keepdim, dtype):
    """torch's ``vector_norm`` of ``x`` over its ``reduced`` (run, dimensions): summed in double
    by the compiled kernel where it applies (``_summed_norms``), else as the norm of its blocks'
    norms, accumulated in float32 (or ``dtype``)."""
    run, dims = reduced
    norms = _summed_norms(x, ord, run, dtype)
    if norms is None:
        rows = x if dims == 1 and x.dim() == 2 else x.reshape(-1, run)
        norms = _norm_of_blocks(vector_norm, rows, ord, torch.float32 if dtype is None else dtype)
    # Each op skipped where it would change nothing: right after torch's parallel kernels, a
    # Python-level op costs several microseconds while the pool's threads spin down.
    shape = x.shape[:x.dim() - dims] + ((1,) * dims if keepdim else ())
    if norms.shape != shape:
        norms = norms.reshape(shape)
    wanted = x.dtype if dtype is None else dtype
    return norms if norms.dtype is wanted else norms.to(wanted)


def _summed_norms(x, ord, run, dtype):
    """The 1-norm of a float32 ``x`` reduced whole, summed in double by the compiled kernel
    (``native.long_sums``): one pass, 0.2-0.8x torch's time, where torch's blocks of a 1-norm
    cost 1.1-1.6x. None where it does not apply: other orders, dtypes or shapes, a gradient to
    record, no compiled kernels. A 2-norm keeps the blocks: torch's 2-norm over them runs on
    its own threads in 0.7-0.8x its single pass, and the compiled kernel, whose second thread
    shares a core with torch's spinning pool, in 0.8-1.5x (2**20 to 2**24, taking turns with
    torch's ops)."""
    if ord != 1 or (dtype is not None and dtype is not torch.float32) or x.numel() != run \
            or not native.usable():
        return None
    return native.long_sums(native.SUM_ABS, x)


def _norm_of_blocks(vector_norm, rows, ord, accumulate):
    """Each row's norm, through as many levels of blocks as its length needs: a norm kernel
    that runs one accumulator (torch's 1-norm) drifts over the blocks' norms too."""
    run = rows.shape[1]
    if accumulate is rows.dtype:
        accumulate = None                # the same sums, on torch's faster path for its own dtype
    if run <= NORM_BLOCK:
        return vector_norm(rows, ord, -1, dtype=accumulate)
    whole = run - run % NORM_BLOCK
    head = rows if whole == run else rows[:, :whole]
    parts = vector_norm(head.reshape(rows.shape[0], -1, NORM_BLOCK), ord, -1, dtype=accumulate)
    if whole < run:
        parts = torch.cat([parts, vector_norm(rows[:, whole:], ord, -1, True, dtype=accumulate)], 1)
    return _norm_of_blocks(vector_norm, parts, ord, None)


def _vector_norm(api, count, vector_norm, original):
    @functools.wraps(original)
    def accurate_vector_norm(x, *args, **kwargs):
        # Most norms are short: one type check and a length, then torch's call as it was made.
        if type(x) not in _PLAIN or x.numel() < NORM_BLOCKED_FROM:
            return _as_called(original, x, args, kwargs)
        ord, dim, keepdim, dtype, out = _norm_arguments(*args, **kwargs)
        if dim.__class__ is int and (not -x.dim() <= dim < x.dim() or x.shape[dim] < NORM_BLOCKED_FROM):
            return _as_called(original, x, args, kwargs)
        reduced = None if out is not None else _blockable_norm(x, ord, dim, dtype)
        if reduced is None:
            return original(x, *args, **kwargs)
        count(api, BLOCKED)
        return blocked_norm(vector_norm, x, ord, reduced, keepdim, dtype)
    return accurate_vector_norm


def _as_called(original, first, args, kwargs):
    """``original`` called as the program called its wrapper. A builtin called with ``*``
    or ``**`` of nothing costs about 200 ns more (no vectorcall): those are left out."""
    if kwargs:
        return original(first, *args, **kwargs)
    return original(first, *args) if args else original(first)


def _norm_arguments(ord=2, dim=None, keepdim=False, *, dtype=None, out=None):
    """``vector_norm``'s arguments after its input, by name (torch checks them all)."""
    return ord, dim, keepdim, dtype, out


def _linalg_norm(api, count, vector_norm, original):
    """``torch.linalg.norm``'s vector norms: a vector's (a 1-D input or one ``dim``) and the
    Frobenius norm, which is the 2-norm of the elements; matrix norms are torch's."""
    @functools.wraps(original)
    def accurate_linalg_norm(A, *args, **kwargs):
        if type(A) not in _PLAIN or A.numel() < NORM_BLOCKED_FROM:
            return _as_called(original, A, args, kwargs)
        ord, dim, keepdim, out, dtype = _linalg_norm_arguments(*args, **kwargs)
        reduced = order = None
        if out is None:
            single = isinstance(dim, int) or (isinstance(dim, (tuple, list)) and len(dim) == 1)
            pair = isinstance(dim, (tuple, list)) and len(dim) == 2
            if ord is None or (ord == "fro" and (pair or (dim is None and A.dim() == 2))):
                order = 2               # the elements' 2-norm: dim=None flattens, as torch does
            elif not isinstance(ord, str) and (single or (dim is None and A.dim() == 1)):
                order = ord
            if order is not None:
                reduced = _blockable_norm(A, order, dim, dtype)
        if reduced is None:
            return original(A, *args, **kwargs)
        count(api, BLOCKED)
        return blocked_norm(vector_norm, A, order, reduced, keepdim, dtype)
    return accurate_linalg_norm


def _linalg_norm_arguments(ord=None, dim=None, keepdim=False, *, out=None, dtype=None):
    return ord, dim, keepdim, out, dtype


def _foreach_norm(api, count, vector_norm, original):
    @functools.wraps(original)
    def accurate_foreach_norm(tensors, *args, **kwargs):
        if not any(type(t) in _PLAIN and t.numel() >= NORM_BLOCKED_FROM for t in tensors):
            return _as_called(original, tensors, args, kwargs)
        ord, dtype = _foreach_norm_arguments(*args, **kwargs)
        blockable = [_blockable_norm(t, ord, None, dtype) for t in tensors]
        if not any(blockable):
            return original(tensors, *args, **kwargs)
        count(api, BLOCKED)
        short = [t for t, reduced in zip(tensors, blockable) if reduced is None]
        short_norms = iter(original(short, *args, **kwargs) if short else ())
        return tuple(next(short_norms) if reduced is None
                     else blocked_norm(vector_norm, t, ord, reduced, False, dtype)
                     for t, reduced in zip(tensors, blockable))
    return accurate_foreach_norm


def _foreach_norm_arguments(ord=2, dtype=None):
    return ord, dtype


def _dist(api, count, vector_norm, original):
    """Two float32 inputs of one shape, p 1 or 2, no gradient recorded: summed in double by the
    compiled kernel from 2**20 elements. Otherwise, from 2**22, two inputs of one shape: torch's
    ``dist`` of each block pair, whose norm is the whole distance (no difference tensor: a fresh
    one costs a page fault a page, more than the distance itself under 2**22 elements).
    Broadcast inputs: the norm of the difference."""
    @functools.wraps(original)
    def accurate_dist(x, other, p=2):
        if type(x) in _PLAIN and type(other) in _PLAIN and x.shape == other.shape \
                and x.dtype is torch.float32 and other.dtype is torch.float32 \
                and (p == 1 or p == 2) and x.numel() >= NORM_BLOCKED_FROM and native.usable():
            summed = native.long_sums(native.SUM_ABS_DIFFERENCES if p == 1
                                      else native.SUM_SQUARED_DIFFERENCES, x, other)
            if summed is not None:
                count(api, BLOCKED)
                return summed.reshape(())
        if type(x) in _PLAIN and type(other) in _PLAIN and other.dtype == x.dtype \
                and max(x.numel(), other.numel()) >= DIST_BLOCKED_FROM:
            if x.shape == other.shape and x.is_contiguous() and other.is_contiguous():
                if _blockable_norm(x, p, None, None) is not None:
                    count(api, BLOCKED)
                    pairs = zip(x.reshape(-1).split(DIST_BLOCK), other.reshape(-1).split(DIST_BLOCK))
                    return vector_norm(torch.stack([original(a, b, p) for a, b in pairs]), p)
            else:
                difference = x - other
                reduced = _blockable_norm(difference, p, None, None)
                if reduced is not None:
                    count(api, BLOCKED)
                    return blocked_norm(vector_norm, difference, p, reduced, False, None)
        return original(x, other, p)
    return accurate_dist


def _cosine_similarity(api, count, vector_norm, original):
    """Along one long run: each input divided by its blocked norm (at least ``eps``), then the
    products summed, which torch's pairwise sum keeps exact; torch divides by its own norms."""
    @functools.wraps(original)
    def accurate_cosine_similarity(x1, x2, *args, **kwargs):
        if type(x1) in _PLAIN and type(x2) in _PLAIN and x1.numel() >= NORM_BLOCKED_FROM \
                and x1.shape == x2.shape and x1.dtype == x2.dtype:
            dim, eps = _cosine_arguments(*args, **kwargs)
            first = _blockable_norm(x1, 2, dim, None) if isinstance(dim, int) else None
            second = _blockable_norm(x2, 2, dim, None) if first is not None else None
            if second is not None:
                count(api, BLOCKED)
                summed = _summed_cosines(x1, x2, first, eps)
                if summed is not None:
                    return summed
                norm1 = blocked_norm(vector_norm, x1, 2, first, True, None).clamp_min(eps)
                norm2 = blocked_norm(vector_norm, x2, 2, second, True, None).clamp_min(eps)
                return ((x1 / norm1) * (x2 / norm2)).sum(dim)
        if args or kwargs:
            return original(x1, x2, *args, **kwargs)
        return original(x1, x2)
    return accurate_cosine_similarity


def _summed_cosines(x1, x2, reduced, eps):
    """Each run's dot product over the product of its two norms (each at least ``eps``, as torch
    clamps them), the three summed in double by the compiled kernel and divided in double: no
    normalized copies of the inputs, which cost more than the sums. None where it does not apply."""
    run, dims = reduced
    rows = x1.numel() // run
    if x1.dtype is not torch.float32 or not native.usable():
        return None
    dots = native.long_sums(native.SUM_PRODUCTS, x1, x2, rows)
    norms1 = native.long_sums(native.SUM_SQUARES, x1, rows=rows) if dots is not None else None
    norms2 = native.long_sums(native.SUM_SQUARES, x2, rows=rows) if norms1 is not None else None
    if norms2 is None:
        return None
    cosines = dots.double() / (norms1.double().clamp_min(eps) * norms2.double().clamp_min(eps))
    return cosines.float().reshape(x1.shape[:x1.dim() - dims])


def _cosine_arguments(dim=1, eps=1e-8):
    return dim, eps


# --- dots ---------------------------------------------------------------------------------
def _blockable_dot(left, right):
    return type(left) in _PLAIN and type(right) in _PLAIN and left.dtype == torch.float32 \
        and right.dtype == torch.float32 and right.dim() == 1 \
        and right.numel() >= DOT_BLOCKED_FROM and left.device.type == "cpu"


def _dot(api, count, vector_norm, original):
    @functools.wraps(original)
    def accurate_dot(x, y, *args, **kwargs):
        if args or kwargs:
            return original(x, y, *args, **kwargs)
        if not _blockable_dot(x, y) or x.dim() != 1 or x.numel() != y.numel():
            return original(x, y)
        count(api, BLOCKED)
        return torch.stack([original(a, b) for a, b in zip(x.split(DOT_BLOCK), y.split(DOT_BLOCK))]).sum()
    return accurate_dot


def _mv(api, count, vector_norm, original):
    @functools.wraps(original)
    def accurate_mv(matrix, vector, *args, **kwargs):
        if args or kwargs:
            return original(matrix, vector, *args, **kwargs)
        if not _blockable_dot(matrix, vector) or matrix.dim() != 2 or matrix.shape[1] != vector.numel():
            return original(matrix, vector)
        count(api, BLOCKED)
        return torch.stack([original(a, b) for a, b in zip(matrix.split(MV_BLOCK, 1),
                                                          vector.split(MV_BLOCK))]).sum(0)
    return accurate_mv
