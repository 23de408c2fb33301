"""xformers.ops: memory-efficient attention and the helpers programs import beside it."""

from __future__ import annotations

import torch

from cudashim.substitutes._refuse import refusing_getattr

from . import fmha
from .fmha import (AttentionBias, AttentionOp, BlockDiagonalMask, LowerTriangularMask,
                   LowerTriangularMaskWithTensorBias, MemoryEfficientAttentionCutlassFwdFlashBwOp,
                   MemoryEfficientAttentionCutlassOp, MemoryEfficientAttentionFlashAttentionOp,
                   memory_efficient_attention, memory_efficient_attention_forward)


def unbind(x: torch.Tensor, dim: int):
    return torch.unbind(x, dim)


def stack_or_none(tensors, dim: int):
    return torch.stack(tensors, dim=dim)


_WAY_OUT = "write it with torch operations (torch.nn.functional has SiLU, linear, index_add)"
__getattr__ = refusing_getattr(__name__, {name: _WAY_OUT for name in (
    "SwiGLU", "swiglu", "SwiGLUPackedFusedOp", "index_select_cat", "scaled_index_add",
    "fused_allgather_and_linear", "fused_linear_and_reducescatter", "sequence_parallel_leading_matmul",
    "rope_padded", "RMSNorm", "sparsify24")})
