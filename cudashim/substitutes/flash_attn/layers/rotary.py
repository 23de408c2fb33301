"""flash_attn.layers.rotary: rotary position embeddings on torch operations.

``cos``/``sin`` are (seqlen_ro, rotary_dim / 2); the first ``rotary_dim`` channels of each
head are rotated, the rest pass through. ``interleaved`` pairs channels (0, 1), (2, 3), ...
(GPT-J); otherwise the first half pairs with the second (GPT-NeoX). Computed in float32.
"""

from __future__ import annotations

from typing import Optional, Union

import torch


def rotate(x, cos, sin, positions, interleaved: bool):
    """Rotate x (batch, seqlen, heads, headdim) by the angles at ``positions`` (batch, seqlen)."""
    half = cos.shape[-1]
    rotary_dim = 2 * half
    c = cos[positions.long()].float().unsqueeze(-2)            # (batch, seqlen, 1, half)
    s = sin[positions.long()].float().unsqueeze(-2)
    head, rest = x[..., :rotary_dim].float(), x[..., rotary_dim:]
    if interleaved:
        even, odd = head[..., 0::2], head[..., 1::2]
        rotated = torch.stack((even * c - odd * s, even * s + odd * c), dim=-1).flatten(-2)
    else:
        first, second = head[..., :half], head[..., half:]
        rotated = torch.cat((first * c - second * s, first * s + second * c), dim=-1)
    return torch.cat((rotated.to(x.dtype), rest), dim=-1)


def _positions(batch: int, seqlen: int, seqlen_offsets, device):
    steps = torch.arange(seqlen, device=device)
    if isinstance(seqlen_offsets, torch.Tensor):
        return seqlen_offsets.to(device).long().view(-1, 1) + steps
    return (steps + int(seqlen_offsets)).expand(batch, seqlen)


def apply_rotary_emb(x, cos, sin, interleaved: bool = False, inplace: bool = False,
                     seqlen_offsets: Union[int, torch.Tensor] = 0,
                     cu_seqlens: Optional[torch.Tensor] = None, max_seqlen: Optional[int] = None):
    """x: (batch, seqlen, nheads, headdim), or (total, nheads, headdim) with ``cu_seqlens``.
    ``seqlen_offsets``: an int, or (batch,) per sequence (decoding with a cache)."""
    if cu_seqlens is None:
        positions = _positions(x.shape[0], x.shape[1], seqlen_offsets, x.device)
        out = rotate(x, cos, sin, positions, interleaved)
    else:
        bounds = [int(b) for b in cu_seqlens.tolist()]
        pieces = []
        for b in range(len(bounds) - 1):
            offset = seqlen_offsets[b] if isinstance(seqlen_offsets, torch.Tensor) else seqlen_offsets
            piece = x[bounds[b]:bounds[b + 1]][None]
            positions = _positions(1, piece.shape[1], int(offset), x.device)
            pieces.append(rotate(piece, cos, sin, positions, interleaved)[0])
        out = torch.cat(pieces)
    if inplace:
        x.copy_(out)
        return x
    return out


apply_rotary_emb_func = apply_rotary_emb


def apply_rotary_emb_qkv_(qkv, cos, sin, cos_k=None, sin_k=None, interleaved: bool = False,
                          seqlen_offsets: Union[int, torch.Tensor] = 0, num_heads_q=None):
    """qkv: (batch, seqlen, 3, nheads, headdim), or (batch, seqlen, nheads_q + 2 * nheads_k,
    headdim) with ``num_heads_q``; q and k are rotated in place."""
    cos_k = cos if cos_k is None else cos_k
    sin_k = sin if sin_k is None else sin_k
    if qkv.dim() == 5:
        q, k = qkv[:, :, 0], qkv[:, :, 1]
    else:
        kv_heads = (qkv.shape[2] - num_heads_q) // 2
        q, k = qkv[:, :, :num_heads_q], qkv[:, :, num_heads_q:num_heads_q + kv_heads]
    apply_rotary_emb(q, cos, sin, interleaved, inplace=True, seqlen_offsets=seqlen_offsets)
    apply_rotary_emb(k, cos_k, sin_k, interleaved, inplace=True, seqlen_offsets=seqlen_offsets)
    return qkv


def apply_rotary_emb_kv_(kv, cos, sin, interleaved: bool = False,
                         seqlen_offsets: Union[int, torch.Tensor] = 0):
    """kv: (batch, seqlen, 2, nheads, headdim); k is rotated in place."""
    apply_rotary_emb(kv[:, :, 0], cos, sin, interleaved, inplace=True, seqlen_offsets=seqlen_offsets)
    return kv
