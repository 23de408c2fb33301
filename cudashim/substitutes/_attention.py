"""The attention the flash_attn and xformers stand-ins compute, on torch's own operations.

Both libraries take ``(batch, seqlen, heads, headdim)`` tensors, allow fewer key/value heads
than query heads (grouped-query attention), and align a causal mask to the bottom right
when the query is shorter than the keys (the query's last row sees every key). Plain calls
go to ``scaled_dot_product_attention``, which has a fast kernel on every target; softcapping
and the log-sum-exp or probabilities that ``return_attn_probs`` asks for need the scores
themselves, so those are computed explicitly (in float32, as flash attention accumulates).
A query row that may see no key gives zeros, as flash attention does.
"""

from __future__ import annotations

import math
from typing import Optional, Tuple

import torch
import torch.nn.functional as F

from torch.torch_version import TorchVersion

_SDPA_TAKES_GQA = TorchVersion(torch.__version__) >= "2.5"     # enable_gqa= came in 2.5


def visibility(seqlen_q: int, seqlen_k: int, causal: bool, window: Tuple[int, int],
               device, top_left: bool = False) -> Optional[torch.Tensor]:
    """The (seqlen_q, seqlen_k) mask of the keys each query may see (True: seen), or None
    when every query sees every key. ``window = (left, right)``, -1 for unbounded; query i
    sits at key position ``i + seqlen_k - seqlen_q`` (bottom right), or ``i`` (``top_left``)."""
    left, right = window
    if causal:
        right = 0
    if left < 0 and right < 0:
        return None
    rows = torch.arange(seqlen_q, device=device).unsqueeze(1) + (0 if top_left else seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=device).unsqueeze(0)
    seen = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool, device=device)
    if right >= 0:
        seen &= cols <= rows + right
    if left >= 0:
        seen &= cols >= rows - left
    return seen


def sees_no_key_somewhere(seqlen_q: int, seqlen_k: int, causal: bool, window: Tuple[int, int],
                          top_left: bool = False) -> bool:
    """Whether some query row of ``visibility``'s mask sees no key, from the sizes alone: a
    CUDA graph's capture allows no read of a tensor's value on the host, and flash attention
    under graphs (a decoding step captured once, replayed per token) is the common case. Query
    i sits at key position p = i + offset and sees the keys from p - left to p + right: the first
    row sees none where p + right < 0, the last where p - left > seqlen_k - 1."""
    left, right = window
    if causal:
        right = 0
    if (left < 0 and right < 0) or seqlen_q == 0:
        return False
    first = 0 if top_left else seqlen_k - seqlen_q
    last = first + seqlen_q - 1
    return seqlen_k == 0 or (right >= 0 and first + right < 0) or (left >= 0 and last - left > seqlen_k - 1)


def alibi_bias(slopes: torch.Tensor, seqlen_q: int, seqlen_k: int) -> torch.Tensor:
    """``-slope * |i + seqlen_k - seqlen_q - j|`` as (batch or 1, heads, seqlen_q, seqlen_k)."""
    rows = torch.arange(seqlen_q, device=slopes.device).unsqueeze(1) + (seqlen_k - seqlen_q)
    cols = torch.arange(seqlen_k, device=slopes.device).unsqueeze(0)
    distance = (rows - cols).abs().to(torch.float32)
    slopes = slopes.to(torch.float32)
    if slopes.dim() == 1:
        slopes = slopes.unsqueeze(0)
    return -slopes[:, :, None, None] * distance


def attention(q, k, v, *, scale: Optional[float] = None, causal: bool = False,
              window: Tuple[int, int] = (-1, -1), softcap: float = 0.0, alibi_slopes=None,
              bias: Optional[torch.Tensor] = None, dropout_p: float = 0.0,
              need_weights: bool = False, top_left: bool = False):
    """Attention over (batch, seqlen, heads, headdim) tensors.

    ``bias`` is added to the scores, broadcast to (batch, heads, seqlen_q, seqlen_k);
    ``top_left`` aligns the causal mask and window to the top left (xformers'
    ``LowerTriangularMask``) instead of flash attention's bottom right. Returns the output, or
    (output, log-sum-exp (batch, heads, seqlen_q) in float32, probabilities) when ``need_weights``.
    """
    batch, seqlen_q, heads, headdim = q.shape
    seqlen_k, kv_heads = k.shape[1], k.shape[2]
    if heads % kv_heads:
        raise RuntimeError(f"Number of heads in key/value ({kv_heads}) must divide the number "
                           f"of heads in query ({heads})")
    scale = 1.0 / math.sqrt(headdim) if scale is None else scale
    blind_rows = None
    seen = visibility(seqlen_q, seqlen_k, causal, window, q.device, top_left)
    if seen is not None and sees_no_key_somewhere(seqlen_q, seqlen_k, causal, window, top_left):
        blind_rows = ~seen.any(dim=-1)                     # rows that see no key at all
        seen = seen | blind_rows.unsqueeze(-1)
    if alibi_slopes is not None:
        alibi = alibi_bias(alibi_slopes, seqlen_q, seqlen_k)
        bias = alibi if bias is None else bias + alibi
    q_, k_, v_ = (t.transpose(1, 2) for t in (q, k, v))    # (batch, heads, seqlen, headdim)
    if softcap or need_weights:
        out, lse, probs = _explicit(q_, k_, v_, scale, softcap, seen, bias, dropout_p, heads // kv_heads)
    else:
        out, lse, probs = _sdpa(q_, k_, v_, scale, seen, bias, dropout_p, heads // kv_heads), None, None
    if blind_rows is not None:
        out = out.masked_fill(blind_rows[..., None], 0.0)
        if need_weights:
            probs = probs.masked_fill(blind_rows[..., None], 0.0)
            lse = lse.masked_fill(blind_rows, float("inf"))
    out = out.transpose(1, 2)
    return (out, lse, probs) if need_weights else out


def _mask(seen, bias, dtype):
    """SDPA's attn_mask: the boolean mask alone, or the bias with unseen keys at -inf."""
    if bias is None:
        return seen
    bias = bias.to(dtype)
    return bias if seen is None else bias.masked_fill(~seen, float("-inf"))


def _sdpa(q, k, v, scale, seen, bias, dropout_p, groups):
    mask = _mask(seen, bias, q.dtype)
    if groups > 1 and _SDPA_TAKES_GQA:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p,
                                              scale=scale, enable_gqa=True)
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=dropout_p, scale=scale)


def _explicit(q, k, v, scale, softcap, seen, bias, dropout_p, groups):
    if groups > 1:
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q.float(), k.float().transpose(-2, -1)) * scale
    if softcap:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = scores + bias.float()
    if seen is not None:
        scores = scores.masked_fill(~seen, float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    kept = F.dropout(probs, p=dropout_p) if dropout_p else probs
    out = torch.matmul(kept, v.float()).to(q.dtype)
    return out, lse, probs.to(q.dtype)
