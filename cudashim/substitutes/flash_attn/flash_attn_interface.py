"""flash_attn's functional API (2.x), computed by ``cudashim.substitutes._attention``.

Signatures are FlashAttention 2's, parameter for parameter: transformers reads them with
``inspect.signature`` to decide which options to pass. ``deterministic`` and ``num_splits``
choose between CUDA kernels and change nothing here. Variable-length calls (``varlen``) run
one sequence at a time, their boundaries read on the host; ``block_table`` (a paged KV cache) is
read block by block; ``flash_attn_with_kvcache`` slices each sequence's keys by its length.

Inside a CUDA graph's capture, which forbids reading a value on the host: where cudashim records
the graph, a variable-length call or ``flash_attn_with_kvcache`` is recorded as one step that each
replay runs as an eager call, reading that replay's lengths, into outputs the capture allocates
(``_recorded_for_the_replays``), so a replay attends over the keys each sequence has, as CUDA's
kernel does, not over the whole cache.
"""

from __future__ import annotations

from typing import Optional, Union

import torch

from cudashim.graphs.graph import recording_here
from cudashim.substitutes._attention import attention
from .layers.rotary import rotate

_NO_WINDOW = (-1, -1)


def _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
           return_attn_probs):
    return attention(q, k, v, scale=softmax_scale, causal=causal, window=tuple(window_size),
                     softcap=softcap, alibi_slopes=alibi_slopes, dropout_p=dropout_p,
                     need_weights=return_attn_probs)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False,
                    window_size=_NO_WINDOW, softcap=0.0, alibi_slopes=None, deterministic=False,
                    return_attn_probs=False):
    """q: (batch, seqlen_q, nheads, headdim); k, v: (batch, seqlen_k, nheads_k, headdim).
    Returns out, or (out, softmax_lse, attention probabilities) with return_attn_probs."""
    return _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs)


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False,
                              window_size=_NO_WINDOW, softcap=0.0, alibi_slopes=None,
                              deterministic=False, return_attn_probs=False):
    """qkv: (batch, seqlen, 3, nheads, headdim)."""
    q, k, v = qkv.unbind(dim=2)
    return _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False,
                             window_size=_NO_WINDOW, softcap=0.0, alibi_slopes=None,
                             deterministic=False, return_attn_probs=False):
    """q: (batch, seqlen_q, nheads, headdim); kv: (batch, seqlen_k, 2, nheads_k, headdim)."""
    k, v = kv.unbind(dim=2)
    return _dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                  return_attn_probs)


# --- variable length ------------------------------------------------------------------------
def _bounds(cu_seqlens) -> list:
    return [int(x) for x in cu_seqlens.tolist()]


def _paged(cache, blocks, length):
    """The first ``length`` rows of a paged cache (num_blocks, block_size, heads, headdim)
    listed by ``blocks``: only the blocks they fill are gathered, not every block the table
    lists for the sequence (the most it may grow to)."""
    used = -(-length // cache.shape[1])
    return cache[blocks[:used].long()].flatten(0, 1)[:length]


def _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
            softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
            block_table=None):
    starts_q, starts_k = _bounds(cu_seqlens_q), _bounds(cu_seqlens_k)
    outs, lses, probs = [], [], []
    for b in range(len(starts_q) - 1):
        qb = q[starts_q[b]:starts_q[b + 1]]
        length_k = starts_k[b + 1] - starts_k[b]
        if block_table is None:
            kb, vb = k[starts_k[b]:starts_k[b + 1]], v[starts_k[b]:starts_k[b + 1]]
        else:
            kb, vb = _paged(k, block_table[b], length_k), _paged(v, block_table[b], length_k)
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        result = attention(qb[None], kb[None], vb[None], scale=softmax_scale, causal=causal,
                           window=tuple(window_size), softcap=softcap, alibi_slopes=slopes,
                           dropout_p=dropout_p, need_weights=return_attn_probs)
        if return_attn_probs:
            out, lse, p = result
            lses.append(lse[0])
            padded = p.new_zeros(p.shape[1], int(max_seqlen_q), int(max_seqlen_k))
            padded[:, :p.shape[2], :p.shape[3]] = p[0]
            probs.append(padded)
        else:
            out = result
        outs.append(out[0])
    out = torch.cat(outs) if outs else q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
    if not return_attn_probs:
        return out
    lse = torch.cat(lses, dim=-1) if lses else q.new_empty(q.shape[1], 0, dtype=torch.float32)
    return out, lse, torch.stack(probs) if probs else None


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                           dropout_p=0.0, softmax_scale=None, causal=False, window_size=_NO_WINDOW,
                           softcap=0.0, alibi_slopes=None, deterministic=False,
                           return_attn_probs=False, block_table=None):
    """q: (total_q, nheads, headdim); k, v: (total_k, nheads_k, headdim), or paged caches
    (num_blocks, block_size, nheads_k, headdim) with ``block_table``; cu_seqlens_*:
    (batch + 1,) int32 cumulative lengths. softmax_lse is (nheads, total_q)."""
    def computed():
        return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                       softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs,
                       block_table)
    recording = recording_here()
    if recording is not None and not return_attn_probs and not dropout_p:
        out = q.new_empty(q.shape[0], q.shape[1], v.shape[-1])
        _recorded_for_the_replays(recording, "flash_attn_varlen_func", computed, (out,), ())
        return out
    return computed()


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0,
                                     softmax_scale=None, causal=False, window_size=_NO_WINDOW,
                                     softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """qkv: (total, 3, nheads, headdim)."""
    q, k, v = qkv.unbind(dim=1)
    return _varlen(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                    dropout_p=0.0, softmax_scale=None, causal=False,
                                    window_size=_NO_WINDOW, softcap=0.0, alibi_slopes=None,
                                    deterministic=False, return_attn_probs=False):
    """q: (total_q, nheads, headdim); kv: (total_k, 2, nheads_k, headdim)."""
    k, v = kv.unbind(dim=1)
    return _varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                   softmax_scale, causal, window_size, softcap, alibi_slopes, return_attn_probs)


# --- decoding with a KV cache ---------------------------------------------------------------
def _per_batch(value, b: int, default: int) -> int:
    if value is None:
        return default
    if isinstance(value, int):
        return value
    return int(value[b]) if value.dim() else int(value)


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens: Optional[Union[int, torch.Tensor]] = None,
                            cache_batch_idx: Optional[torch.Tensor] = None,
                            cache_leftpad: Optional[torch.Tensor] = None,
                            block_table: Optional[torch.Tensor] = None, softmax_scale=None,
                            causal=False, window_size=_NO_WINDOW, softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0,
                            return_softmax_lse=False):
    """Attention of q (batch, seqlen_q, nheads, headdim) over a KV cache, after writing the
    new k, v (batch, seqlen_new, nheads_k, headdim) into it in place at ``cache_seqlens``.

    The cache is (batch_cache, seqlen_cache, nheads_k, headdim), or paged (num_blocks,
    block_size, nheads_k, headdim) with ``block_table`` (batch, max_blocks). With
    ``rotary_cos``/``rotary_sin`` (seqlen_ro, rotary_dim / 2), the new keys are rotated at
    their positions, and q at its own (causal or local) or all at ``cache_seqlens``.
    Returns out, or (out, softmax_lse (batch, nheads, seqlen_q)).
    """
    if (k is None) != (v is None):
        raise ValueError("flash_attn_with_kvcache: give both k and v, or neither")
    arguments = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
                 block_table, softmax_scale, causal, window_size, softcap, rotary_interleaved, alibi_slopes,
                 return_softmax_lse)
    recording = recording_here()
    if recording is not None:
        out = q.new_empty(*q.shape[:-1], v_cache.shape[-1])
        outputs = (out, q.new_empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32)) \
            if return_softmax_lse else (out,)
        _recorded_for_the_replays(recording, "flash_attn_with_kvcache",
                                  lambda: _with_kvcache_eagerly(*arguments), outputs, (k_cache, v_cache))
        return outputs if return_softmax_lse else out
    return _with_kvcache_eagerly(*arguments)


def _recorded_for_the_replays(recording, name: str, computed, outputs, written) -> None:
    """Record ``computed()``, an eager call that reads lengths or boundaries on the host, as one
    step of the capture ``recording`` that each replay runs, its results copied into ``outputs``
    (allocated by the capture, as CUDA's kernel writes into memory the capture allocated).
    ``written``: what it writes in place (a KV cache). Not run now: CUDA's capture runs nothing."""
    from cudashim.graphs.recording import OpaqueWork

    def replayed():
        results = computed()
        for output, result in zip(outputs, results if isinstance(results, tuple) else (results,)):
            output.copy_(result)
    recording.record_opaque(OpaqueWork(name, replayed), written)


def _with_kvcache_eagerly(q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
                          cache_leftpad, block_table, softmax_scale, causal, window_size, softcap,
                          rotary_interleaved, alibi_slopes, return_softmax_lse):
    """``flash_attn_with_kvcache``, each sequence's keys sliced by its length read on the host."""
    batch, seqlen_q = q.shape[0], q.shape[1]
    seqlen_new = 0 if k is None else k.shape[1]
    paged = block_table is not None
    block_size = k_cache.shape[1]
    capacity = block_table.shape[1] * block_size if paged else k_cache.shape[1]
    local = tuple(window_size) != _NO_WINDOW
    outs, lses = [], []
    for b in range(batch):
        row = _per_batch(cache_batch_idx, b, b)
        length = _per_batch(cache_seqlens, b, capacity if k is None else 0)
        start = _per_batch(cache_leftpad, b, 0)
        if length + seqlen_new > capacity:
            raise ValueError(f"flash_attn_with_kvcache: {length} cached + {seqlen_new} new keys "
                             f"exceed the cache's {capacity} positions")
        qb = q[b:b + 1]
        if rotary_cos is not None:
            first = length - start
            if causal or local:
                q_positions = torch.arange(first, first + seqlen_q, device=q.device)
            else:
                q_positions = torch.full((seqlen_q,), first, device=q.device)
            qb = rotate(qb, rotary_cos, rotary_sin, q_positions[None], rotary_interleaved)
        if k is not None:
            kb, vb = k[b:b + 1], v[b:b + 1]
            if rotary_cos is not None:
                k_positions = torch.arange(length - start, length - start + seqlen_new, device=q.device)
                kb = rotate(kb, rotary_cos, rotary_sin, k_positions[None], rotary_interleaved)
            _write(k_cache, v_cache, kb[0], vb[0], row, length, block_table[b] if paged else None)
        end = length + seqlen_new
        if paged:
            keys = _paged(k_cache, block_table[b], end)[start:]
            values = _paged(v_cache, block_table[b], end)[start:]
        else:
            keys, values = k_cache[row, start:end], v_cache[row, start:end]
        slopes = alibi_slopes[b] if alibi_slopes is not None and alibi_slopes.dim() == 2 else alibi_slopes
        result = attention(qb, keys[None], values[None], scale=softmax_scale, causal=causal,
                           window=tuple(window_size), softcap=softcap, alibi_slopes=slopes,
                           need_weights=return_softmax_lse)
        if return_softmax_lse:
            outs.append(result[0])
            lses.append(result[1])
        else:
            outs.append(result)
    out = torch.cat(outs)
    return (out, torch.cat(lses)) if return_softmax_lse else out


def _write(k_cache, v_cache, k, v, row: int, at: int, blocks) -> None:
    """Write new keys and values (seqlen_new, nheads_k, headdim) at position ``at``."""
    if blocks is None:
        k_cache[row, at:at + k.shape[0]] = k
        v_cache[row, at:at + v.shape[0]] = v
        return
    block_size = k_cache.shape[1]
    positions = torch.arange(at, at + k.shape[0], device=blocks.device)
    which, offset = blocks.long()[positions // block_size], positions % block_size
    k_cache[which, offset] = k
    v_cache[which, offset] = v
