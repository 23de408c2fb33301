"""xformers.ops.fmha: ``memory_efficient_attention`` and the names programs import with it.

Inputs are (batch, seqlen, heads, headdim), (batch, seqlen, headdim) without a heads axis,
or (batch, seqlen, groups, heads, headdim) for grouped-query attention (keys and values
expanded over ``heads``). ``op=`` picks one of xformers' CUDA kernels; every choice computes
the same attention here, so it is accepted and changes nothing.
"""

from __future__ import annotations

from typing import Optional

import torch

from . import attn_bias
from .attn_bias import (AttentionBias, BlockDiagonalCausalFromBottomRightMask,
                        BlockDiagonalCausalLocalAttentionFromBottomRightMask,
                        BlockDiagonalCausalLocalAttentionMask, BlockDiagonalCausalMask,
                        BlockDiagonalMask, LowerTriangularFromBottomRightLocalAttentionMask,
                        LowerTriangularFromBottomRightMask, LowerTriangularMask,
                        LowerTriangularMaskWithTensorBias)
from .common import AttentionBwOpBase, AttentionFwOpBase, AttentionOp, Inputs
from . import cutlass, flash


def _as_4d(query, key, value, bias):
    """(q, k, v, bias, how to put the output back) with a (batch, seqlen, heads, headdim) layout."""
    if query.dim() == 3:
        if isinstance(bias, torch.Tensor) and bias.dim() == 3:
            bias = bias.unsqueeze(1)
        return query[:, :, None], key[:, :, None], value[:, :, None], bias, lambda out: out[:, :, 0]
    if query.dim() == 5:
        batch, seqlen, groups, heads = query.shape[:4]
        folded = [t.reshape(t.shape[0], t.shape[1], groups * heads, t.shape[-1]) for t in (query, key, value)]
        if isinstance(bias, torch.Tensor) and bias.dim() == 5:
            bias = bias.reshape(bias.shape[0], groups * heads, *bias.shape[-2:])
        return (*folded, bias, lambda out: out.reshape(batch, seqlen, groups, heads, out.shape[-1]))
    if query.dim() != 4:
        raise ValueError(f"memory_efficient_attention takes 3-, 4- or 5-dimensional inputs, "
                         f"got a query of shape {tuple(query.shape)}")
    return query, key, value, bias, lambda out: out


def memory_efficient_attention(query, key, value, attn_bias=None, p: float = 0.0,
                               scale: Optional[float] = None, *, op=None, output_dtype=None):
    """softmax(query @ key^T * scale + attn_bias) @ value, with dropout ``p``.

    ``attn_bias``: None, a tensor broadcast to (batch, heads, seqlen_q, seqlen_k), or one of
    the classes of ``xformers.ops.fmha.attn_bias``.
    """
    q, k, v, bias, restore = _as_4d(query, key, value, attn_bias)
    if bias is None:
        bias = AttentionBias()
    elif isinstance(bias, torch.Tensor):
        bias = _TensorBias(bias)
    elif not isinstance(bias, AttentionBias):
        raise TypeError(f"attn_bias must be a tensor or an xformers AttentionBias, got "
                        f"{type(attn_bias).__name__}")
    out = restore(bias._attend(q, k, v, scale, p))
    return out if output_dtype is None else out.to(output_dtype)


class _TensorBias(AttentionBias):
    causal = False

    def __init__(self, tensor):
        self._bias = tensor

    def _tensor(self):
        return self._bias


def memory_efficient_attention_forward(query, key, value, attn_bias=None, p: float = 0.0,
                                       scale: Optional[float] = None, *, op=None,
                                       output_dtype=None):
    return memory_efficient_attention(query, key, value, attn_bias, p, scale, op=op,
                                      output_dtype=output_dtype)


MemoryEfficientAttentionCutlassOp = (cutlass.FwOp, cutlass.BwOp)
MemoryEfficientAttentionFlashAttentionOp = (flash.FwOp, flash.BwOp)
MemoryEfficientAttentionCutlassFwdFlashBwOp = (cutlass.FwOp, flash.BwOp)

__all__ = ["memory_efficient_attention", "memory_efficient_attention_forward", "attn_bias",
           "AttentionBias", "LowerTriangularMask", "LowerTriangularMaskWithTensorBias",
           "LowerTriangularFromBottomRightMask", "LowerTriangularFromBottomRightLocalAttentionMask",
           "BlockDiagonalMask", "BlockDiagonalCausalMask", "BlockDiagonalCausalFromBottomRightMask",
           "BlockDiagonalCausalLocalAttentionMask",
           "BlockDiagonalCausalLocalAttentionFromBottomRightMask", "AttentionOp",
           "AttentionFwOpBase", "AttentionBwOpBase", "Inputs", "MemoryEfficientAttentionCutlassOp",
           "MemoryEfficientAttentionFlashAttentionOp", "MemoryEfficientAttentionCutlassFwdFlashBwOp"]
