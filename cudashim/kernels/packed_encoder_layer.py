"""bfloat16 transformer encoder layers computed op by op, their products on weights packed once
for oneDNN.

Under ``no_grad`` in eval mode, nn.TransformerEncoderLayer is torch's fused inference path: one C
call (``torch._transformer_encoder_layer_fwd``). Its four products read plain weights, which
oneDNN reorders at every call; its attention is two batched products around a masked softmax; and
a padded batch, which nn.TransformerEncoder hands its layers as a nested tensor, is padded and
unpadded again inside every layer (a ``masked_select`` each time). The same layer op by op: the
products on weights packed once (``packed_linear``), the attention torch's fused
``scaled_dot_product_attention``, and a nested batch's tokens kept as one dense matrix, padded only
around the attention, by index. On a Xeon with AMX-BF16, 4 layers of 512 over a batch of 4 x 128
(two sequences padded to 96) took 0.72x the fused layer's time this way, in one process.

The values are the layer's in bfloat16, not bit for bit the fused call's: attention accumulates
in float32 throughout, and the feed-forward activation is applied before its product is rounded.
"""

from __future__ import annotations

import functools
import warnings
from typing import Callable, NamedTuple, Optional

import torch
import torch.nn.functional as F

from .. import torch_names
from . import packed_linear

_VIEW_FROM_BUFFER = "torch._nested_view_from_buffer"
# What a nested batch's layout is read from, and its result made of: private, each may be absent.
_NESTED_LAYOUT = (_VIEW_FROM_BUFFER, "torch.Tensor._nested_tensor_size", "torch.Tensor._nested_tensor_strides",
                  "torch.Tensor._nested_tensor_storage_offsets")


@functools.lru_cache(maxsize=None)
def unavailable() -> Optional[str]:
    """None where encoder layers can be computed this way here, else why not: packed linears
    (``packed_linear.unavailable``), then a probe, once a process, at the first layer: a small
    layer over a nested batch and over a masked dense one, each against torch's own fused layer
    in bfloat16, to a tolerance (the two round differently)."""
    reason = packed_linear.unavailable()
    if reason is not None:
        return reason
    numbers = torch.Generator().manual_seed(0)
    try:
        # The probe's own nested batch is not the program's: torch's warning that nested tensors
        # are a prototype (once a process) would tell a program that never made one.
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for nested in (True, False):
                agrees = _agrees_with_torch(numbers, nested)
                if agrees is not None and not agrees:
                    return ("computed op by op, an encoder layer does not give torch's fused layer's "
                            f"values here ({'a nested' if nested else 'a masked'} batch)")
    except (AttributeError, RuntimeError, NotImplementedError, TypeError, ValueError) as exc:   # another torch
        return f"an encoder layer cannot be computed op by op here ({exc})"
    return None


def usable() -> bool:
    return torch.backends.mkldnn.enabled and unavailable() is None


def _agrees_with_torch(numbers, nested: bool) -> Optional[bool]:
    """Whether a layer of width 32 (4 heads, a feed-forward of 64) computed here agrees with
    torch's fused layer on a batch of two, the second three tokens shorter; None where this torch
    cannot make the batch (a nested batch without ``_nested_view_from_buffer``)."""
    width, heads, hidden = 32, 4, 64
    def parameter(*shape, scale=0.2):
        return (torch.randn(*shape, generator=numbers, device="cpu") * scale).bfloat16()
    qkv, projection = (parameter(3 * width, width), parameter(3 * width)), (parameter(width, width), parameter(width))
    ffn_1, ffn_2 = (parameter(hidden, width), parameter(hidden)), (parameter(width, hidden), parameter(width))
    norm_1, norm_2 = (1 + parameter(width), parameter(width)), (1 + parameter(width), parameter(width))
    batch = torch.randn(2, 7, width, generator=numbers, device="cpu").bfloat16()
    padding = torch.zeros(2, 7, dtype=torch.bool, device="cpu")
    padding[1, 4:] = True
    if nested:
        batch, mask, mask_type = torch._nested_tensor_from_mask(batch, ~padding, mask_check=False), None, None
    else:
        mask, mask_type = padding, 1
    tokens = tokens_of(batch)
    if tokens is None:
        return None
    fused = torch._transformer_encoder_layer_fwd(
        batch, width, heads, *qkv, *projection, True, False, 1e-5, *norm_1, *norm_2, *ffn_1, *ffn_2,
        mask, mask_type)
    packed = [(packed_linear.pack(weight), bias) for weight, bias in (qkv, projection, ffn_1, ffn_2)]
    ours = tokens.rebuilt(encoder_layer(
        tokens.matrix.clone(), tokens, heads, *packed, norm_1, norm_2, use_gelu=True, norm_first=False,
        eps=1e-5, attends=attention_mask(mask, mask_type, tokens, heads)))
    if nested:
        return _close(ours.to_padded_tensor(0.0), fused.to_padded_tensor(0.0))
    # and nn.MultiheadAttention's fused call, with the attention weights averaged over the heads
    fused_attention = torch._native_multi_head_attention(
        batch, batch, batch, width, heads, *qkv, *projection, mask, True, True, mask_type)
    ours_attention = self_attention(tokens.matrix, tokens, heads, *packed[:2],
                                    attention_mask(mask, mask_type, tokens, heads), weights="averaged")
    return _close(ours, fused) and _close(tokens.rebuilt(ours_attention[0]), fused_attention[0]) \
        and _close(ours_attention[1], fused_attention[1])


def _close(ours: torch.Tensor, fused: torch.Tensor) -> bool:
    return ours.shape == fused.shape and bool(torch.allclose(ours.float(), fused.float(), rtol=0.05, atol=0.05))


class Tokens(NamedTuple):
    """A batch of sequences as one (tokens x width) matrix and how to pad it around attention."""
    matrix: torch.Tensor                     # (tokens, width): the batch's tokens, in order
    sequences: int
    longest: int
    rows: Optional[torch.Tensor]             # each token's row in the padded (sequences x longest) batch; None: not padded
    keys: Optional[torch.Tensor]             # (sequences, 1, 1, longest) True where a key is a token; None: every one is
    rebuilt: Callable[[torch.Tensor], torch.Tensor]     # a (tokens x width) matrix -> the batch's form


def tokens_of(batch: torch.Tensor) -> Optional[Tokens]:
    """``batch`` (a dense batch-first 3-D tensor, or a contiguous nested one of 2-D sequences of one
    width) as ``Tokens``; None for any other form."""
    if not batch.is_nested:
        if batch.dim() != 3 or not batch.is_contiguous():
            return None
        sequences, longest, width = batch.shape
        return Tokens(batch.view(sequences * longest, width), sequences, longest, None, None,
                      lambda matrix: matrix.view(sequences, longest, width))
    if not all(torch_names.has(name) for name in _NESTED_LAYOUT):
        return None
    view_from_buffer = torch_names.get(_VIEW_FROM_BUFFER)
    try:
        sizes, strides = batch._nested_tensor_size(), batch._nested_tensor_strides()
        offsets = batch._nested_tensor_storage_offsets()
        buffer = batch.values()
    except (AttributeError, RuntimeError, NotImplementedError):    # another torch, another layout
        return None
    if sizes.dim() != 2 or sizes.shape[1] != 2 or not sizes.shape[0] \
            or not batch.is_contiguous() or buffer.dim() != 1:
        return None
    lengths, widths = sizes[:, 0], sizes[:, 1]
    width = int(widths[0])
    starts = torch.cumsum(lengths * width, 0) - lengths * width
    if not width or bool((widths != width).any()) or not torch.equal(offsets, starts) \
            or not bool((strides[:, 1] == 1).all()) or not bool((strides[:, 0] == width).all()) \
            or buffer.numel() != int(lengths.sum()) * width:
        return None
    sequences, longest = sizes.shape[0], int(lengths.max())
    positions = torch.arange(longest)
    present = positions < lengths[:, None]                       # (sequences, longest)
    rows = (torch.arange(sequences)[:, None] * longest + positions)[present]
    return Tokens(buffer.view(-1, width), sequences, longest, rows, present[:, None, None, :],
                  lambda matrix: view_from_buffer(matrix.reshape(-1), sizes, strides, offsets))


def attention_mask(mask: Optional[torch.Tensor], mask_type: Optional[int], tokens: Tokens,
                   heads: int) -> Optional[torch.Tensor]:
    """The fused layer's ``mask`` (``mask_type`` 0: sequence x sequence, 1: a key padding mask,
    batch x sequence, 2: both merged, batch x heads x sequence x sequence; nonzero or True where
    a key is left out, as the fused call reads any mask) as attention's boolean mask, True where a
    query attends to a key, for a dense batch. None where there is none; raises ValueError for a
    mask the layer would not read this way, or one that leaves a query no key (the fused call
    gives such a query zeros)."""
    if mask is None:
        return None
    if tokens.rows is not None:
        raise ValueError("a nested batch is masked by its lengths")
    sequences, longest = tokens.sequences, tokens.longest
    shapes = {0: (longest, longest), 1: (sequences, longest), 2: (sequences, heads, longest, longest)}
    expected = shapes.get(mask_type)
    if expected is None or tuple(mask.shape) != expected:
        raise ValueError(f"mask of shape {tuple(mask.shape)} and type {mask_type}")
    attends = mask == 0
    if mask_type == 1:
        attends = attends[:, None, None, :]
    if not bool(attends.any(-1).all()):
        raise ValueError("a query that attends to no key")
    return attends


def encoder_layer(x: torch.Tensor, tokens: Tokens, heads: int, qkv, projection, ffn_1, ffn_2,
                  norm_1, norm_2, *, use_gelu: bool, norm_first: bool, eps: float,
                  attends: Optional[torch.Tensor]) -> torch.Tensor:
    """``torch._transformer_encoder_layer_fwd`` on ``x``, the batch's tokens in bfloat16 (a matrix
    of the caller's, written in place), each product a (packed weight, bias) pair, each norm a
    (weight, bias) pair: the layer's (tokens x width) output in bfloat16."""
    width = x.shape[1]

    def norm(value, weights):
        return F.layer_norm(value, (width,), weights[0], weights[1], eps)

    attended, _ = self_attention(norm(x, norm_1) if norm_first else x, tokens, heads, qkv, projection, attends)
    if norm_first:
        x = x + attended
        hidden = packed_linear.linear(norm(x, norm_2), *ffn_1, "gelu" if use_gelu else "relu")
        return x.add_(packed_linear.linear(hidden, *ffn_2))
    x = norm(x.add_(attended), norm_1)
    hidden = packed_linear.linear(x, *ffn_1, "gelu" if use_gelu else "relu")
    return norm(x.add_(packed_linear.linear(hidden, *ffn_2)), norm_2)


def self_attention(x, tokens: Tokens, heads: int, qkv, projection, attends, *,
                   weights: Optional[str] = None):
    """Multi-head self-attention over the batch's tokens ``x`` (bfloat16), as
    ``torch._native_multi_head_attention`` computes it: (the tokens' result, the attention
    weights or None). Their projections are padded by index where the batch is nested, attention
    is ``scaled_dot_product_attention`` (scaled by the inverse square root of a head's width, as
    the fused call scales), and the result's tokens are projected. ``weights``: None, or
    "averaged" over the heads or "each head" (a dense batch's only), which computes the scores
    and their softmax apart to return them."""
    width = x.shape[1]
    sequences, longest = tokens.sequences, tokens.longest
    projected = packed_linear.linear(x, *qkv)                     # (tokens, 3 x width)
    if tokens.rows is not None:
        projected = projected.new_zeros(sequences * longest, 3 * width).index_copy_(0, tokens.rows, projected)
        attends = tokens.keys
    query, key, value = projected.view(sequences, longest, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
    probabilities = None
    if weights is None:
        attended = F.scaled_dot_product_attention(query, key, value, attn_mask=attends)
    else:
        scores = torch.matmul(query * (width // heads) ** -0.5, key.transpose(-2, -1))
        if attends is not None:
            scores = scores.masked_fill(~attends, float("-inf"))
        probabilities = torch.softmax(scores, -1)
        attended = torch.matmul(probabilities, value)
        if weights == "averaged":
            probabilities = probabilities.mean(1)
    attended = attended.transpose(1, 2).reshape(sequences * longest, width)
    if tokens.rows is not None:
        attended = attended.index_select(0, tokens.rows)
    return packed_linear.linear(attended, *projection), probabilities
