"""bfloat16 linear layers on weights packed once in oneDNN's own layout.

torch's CPU linear in bfloat16 is oneDNN's matmul, which reorders the weight into the blocked
layout its kernels read on every call, then computes. A bfloat16 port pays that on every call;
a kept copy need not: packed once (``mkldnn._reorder_linear_weight``, the layout torch's own
frozen CPU graphs keep), each call is the same oneDNN kernel on it
(``mkldnn._linear_pointwise``), with the same values. On a Xeon with AMX-BF16 a product of 2
rows by 1024 x 1024, read among 96 MB of others, took 0.32-0.34 ms packed against 0.39-0.43
as torch calls it; 64 rows 0.42-0.47 against 0.72-0.83; 256 rows 1.5-1.7 against 1.9-2.1.

Packing is used only where torch's own bfloat16 linear is oneDNN's (torch asks
``mkldnn._is_mkldnn_bf16_supported``: AVX-512 or AMX on x86), so that the values are the ones
a bfloat16 port computes. The three ops are private: where the running torch lacks one, or the
packed call does not compute a probe exactly as torch's own bfloat16 linear does, nothing is
packed and every call is torch's own. A packed weight is an opaque oneDNN tensor: it serves
these calls and nothing else.
"""

from __future__ import annotations

import functools
import logging
from typing import Optional

import torch

from .. import torch_names

log = logging.getLogger(__name__)

_REORDER = "torch.ops.mkldnn._reorder_linear_weight"
_LINEAR = "torch.ops.mkldnn._linear_pointwise"
_TORCH_USES_IT = "torch.ops.mkldnn._is_mkldnn_bf16_supported"
_ops = {}           # "reorder", "linear": the two ops, once found


@functools.lru_cache(maxsize=None)
def not_offered() -> Optional[str]:
    """None where this torch offers packed bfloat16 linears on this CPU, else why not: the ops
    are there and torch's own bfloat16 linear is oneDNN's. Cheap: nothing is computed (the
    matmul table's cache key reads it at every activation)."""
    if not torch.backends.mkldnn.is_available():
        return "torch was built without oneDNN"
    for name in (_REORDER, _LINEAR, _TORCH_USES_IT):
        if not torch_names.has(name):
            return f"torch {torch.__version__} has no {name}"
    try:
        if not torch_names.get(_TORCH_USES_IT)():
            return "torch's bfloat16 linear is not oneDNN's on this CPU"
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        return f"torch cannot say whether its bfloat16 linear is oneDNN's ({exc})"
    return None


@functools.lru_cache(maxsize=None)
def unavailable() -> Optional[str]:
    """None where bfloat16 weights can be packed here, else why not: ``not_offered``, then a
    probe, once a process, at the first packed call (8 ms), not at activation."""
    reason = not_offered()
    if reason is not None:
        return reason
    numbers = torch.Generator().manual_seed(0)
    try:
        _ops.update(reorder=torch_names.get(_REORDER), linear=torch_names.get(_LINEAR))
        # on the host whatever default device a program set (``with torch.device("meta")``)
        weight = torch.randn(48, 320, generator=numbers, device="cpu").bfloat16()
        bias = torch.randn(48, generator=numbers, device="cpu").bfloat16()
        x = torch.randn(3, 5, 320, generator=numbers, device="cpu").bfloat16()
        with torch.no_grad():
            exact = torch.equal(linear(x, pack(weight), bias), torch._C._nn.linear(x, weight, bias))
    except (RuntimeError, NotImplementedError, TypeError) as exc:   # oneDNN refuses, or another schema
        return f"oneDNN's packed bfloat16 linear does not run here ({exc})"
    return None if exact else "oneDNN's packed bfloat16 linear does not compute torch's bfloat16 linear here"


def usable() -> bool:
    """Whether a bfloat16 linear may run on a packed weight now: packing works here, and the
    program has not turned oneDNN off (``torch.backends.mkldnn.enabled``)."""
    return torch.backends.mkldnn.enabled and unavailable() is None


def pack(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` (bfloat16, out x in, as a linear layer holds it) in oneDNN's layout."""
    return _ops["reorder"](weight)


def linear(x: torch.Tensor, packed: torch.Tensor, bias: Optional[torch.Tensor],
           activation: str = "none") -> torch.Tensor:
    """``F.linear(x, weight, bias)`` in bfloat16 on ``pack(weight)``: a dense bfloat16 tensor.
    ``activation``: "relu" or "gelu" (exact, as ``F.gelu``) applied by oneDNN before the result
    is rounded to bfloat16. No gradient is recorded through it."""
    return _ops["linear"](x, packed, bias, activation, [], "none" if activation == "gelu" else "")
