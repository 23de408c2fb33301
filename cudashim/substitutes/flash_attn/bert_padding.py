"""flash_attn.bert_padding: between padded batches and packed variable-length tokens."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def index_first_axis(tensor, indices):
    """Rows ``indices`` of a (total, ...) tensor."""
    return tensor[indices]


def index_put_first_axis(values, indices, first_axis_dim: int):
    """A (first_axis_dim, ...) zero tensor with ``values`` put at rows ``indices``."""
    output = values.new_zeros(first_axis_dim, *values.shape[1:])
    output[indices] = values
    return output


def unpad_input(hidden_states, attention_mask, unused_mask=None):
    """hidden_states (batch, seqlen, ...), attention_mask (batch, seqlen), 1 for a token.

    Returns (tokens (total, ...), indices, cu_seqlens (batch + 1,) int32, max_seqlen_in_batch,
    seqused (batch,) int32); ``unused_mask`` marks tokens kept but not attended to.
    """
    every = attention_mask + unused_mask if unused_mask is not None else attention_mask
    seqlens = every.sum(dim=-1, dtype=torch.int32)
    used = attention_mask.sum(dim=-1, dtype=torch.int32)
    indices = torch.nonzero(every.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen, used


def pad_input(hidden_states, indices, batch: int, seqlen: int):
    """tokens (total, ...) back to (batch, seqlen, ...), zeros where there was padding."""
    output = index_put_first_axis(hidden_states, indices, batch * seqlen)
    return output.view(batch, seqlen, *hidden_states.shape[1:])


def unpad_input_for_concatenated_sequences(hidden_states, attention_mask_in_length):
    """For batches that pack several sequences per row: ``attention_mask_in_length`` (batch,
    seqlen) lists each row's sequence lengths, then zeros."""
    length = attention_mask_in_length.sum(dim=-1)
    seqlen = attention_mask_in_length.size(-1)
    positions = torch.arange(seqlen, device=length.device).expand(len(length), seqlen)
    real = positions < length.unsqueeze(1)
    seqlens = attention_mask_in_length[attention_mask_in_length > 0].to(torch.int32)
    indices = torch.nonzero(real.flatten(), as_tuple=False).flatten()
    max_seqlen = int(seqlens.max().item()) if seqlens.numel() else 0
    cu_seqlens = F.pad(torch.cumsum(seqlens, dim=0, dtype=torch.int32), (1, 0))
    flat = hidden_states.reshape(-1, *hidden_states.shape[2:])
    return index_first_axis(flat, indices), indices, cu_seqlens, max_seqlen
