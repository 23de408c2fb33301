"""Portable kernels for CUDA's fused attention ops: flash attention and memory-efficient
attention, forward and backward, as ``aten::_scaled_dot_product_flash_attention*`` and
``aten::_scaled_dot_product_efficient_attention*`` define them.

``scaled_dot_product_attention`` reaches these ops only on CUDA; every other device takes a
kernel of its own (the host's ``_scaled_dot_product_flash_attention_for_cpu``) or the math path.
Code written for CUDA also calls them by name: context parallelism's ring attention runs
them on each block of the sequence and merges the blocks by their log-sum-exp
(``torch.distributed.tensor.experimental``), and libraries call them for the log-sum-exp the
public function does not return. No other device has a kernel for them, not even the host.

Here each is computed with plain tensor ops on the tensors' own device, float16 and bfloat16 in
float32 (CUDA's kernels accumulate in float32), with CUDA's layouts: the output in the query's
dtype, the log-sum-exp (batch, heads, query length) in float32, the backward from
the output and log-sum-exp it is given (in ring attention, those of the whole sequence, not
the block's). ``is_causal`` masks as torch's math path does (aligned at the top left);
grouped-query inputs (fewer key/value heads) are expanded and their gradients summed back.
Dropout draws a seed from the device's generator in the forward and keeps it in the ops'
random-state output, from which the backward draws the same mask.
"""

from __future__ import annotations

import math

import torch


def _wide(tensor):
    """The tensor in the dtype its arithmetic runs in: float32 for the half types, as CUDA's
    kernels accumulate."""
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def _scale(query, scale):
    return scale if scale is not None else 1.0 / math.sqrt(query.size(-1))


def _expanded(query, tensor):
    """Key or value with as many heads as the query (grouped-query attention)."""
    groups = query.size(-3) // tensor.size(-3)
    return tensor if groups == 1 else tensor.repeat_interleave(groups, dim=-3)


def _summed_heads(grad, like):
    """A gradient of the expanded key or value, summed back over each group of heads."""
    groups = grad.size(-3) // like.size(-3)
    if groups == 1:
        return grad
    return grad.unflatten(-3, (like.size(-3), groups)).sum(-3)


def _scores(query, key, scale, is_causal, bias=None):
    """(query . key) * scale, widened, plus the bias, with the causal mask's -inf."""
    scores = torch.matmul(_wide(query), _wide(key).transpose(-2, -1)) * scale
    if bias is not None:
        scores = scores + bias.to(scores.dtype)
    if is_causal:
        length_q, length_k = scores.shape[-2:]
        allowed = torch.ones(length_q, length_k, dtype=torch.bool, device=scores.device).tril()
        scores = scores.masked_fill(~allowed, float("-inf"))
    return scores


def _probabilities(scores, logsumexp):
    """softmax(scores) from the log-sum-exp, zero on rows the mask leaves empty."""
    logsumexp = logsumexp.to(scores.dtype).unsqueeze(-1)
    return torch.exp(scores - logsumexp.masked_fill(torch.isinf(logsumexp), 0.0))


def _seed(device) -> torch.Tensor:
    """A dropout seed drawn from the device's generator, kept on the device as CUDA keeps its
    Philox state."""
    return torch.randint(0, 2 ** 62, (), device=device)


def _kept(seed: torch.Tensor, shape, dropout_p, device, dtype) -> torch.Tensor:
    """The dropout mask of ``seed``, scaled by 1 / (1 - p): the same in forward and backward."""
    generator = torch.Generator().manual_seed(int(seed))
    kept = torch.rand(shape, generator=generator) >= dropout_p
    return kept.to(device=device, dtype=dtype) / (1.0 - dropout_p)


def _forward(query, key, value, bias, dropout_p, is_causal, scale):
    """(output, logsumexp, seed) of attention over float32 scores."""
    key, value = _expanded(query, key), _expanded(query, value)
    scores = _scores(query, key, _scale(query, scale), is_causal, bias)
    logsumexp = torch.logsumexp(scores, dim=-1)
    probabilities = _probabilities(scores, logsumexp)
    seed = torch.zeros((), dtype=torch.int64, device=query.device)
    if dropout_p > 0:
        seed = _seed(query.device)
        probabilities = probabilities * _kept(seed, probabilities.shape, dropout_p, query.device,
                                              probabilities.dtype)
    output = torch.matmul(probabilities, _wide(value))
    return output.to(query.dtype), logsumexp, seed


def _backward(grad_out, query, key, value, bias, out, logsumexp, seed, dropout_p, is_causal, scale):
    """(grad of query, key, value, scores) from the output and log-sum-exp of the forward."""
    scale = _scale(query, scale)
    key_x, value_x = _expanded(query, key), _expanded(query, value)
    scores = _scores(query, key_x, scale, is_causal, bias)
    probabilities = _probabilities(scores, logsumexp)
    grad_out = _wide(grad_out)
    grad_probabilities = torch.matmul(grad_out, _wide(value_x).transpose(-2, -1))
    dropped = probabilities
    if dropout_p > 0:
        kept = _kept(seed, probabilities.shape, dropout_p, query.device, probabilities.dtype)
        dropped = probabilities * kept
        grad_probabilities = grad_probabilities * kept
    grad_value = torch.matmul(dropped.transpose(-2, -1), grad_out)
    row = (grad_out * _wide(out)).sum(-1, keepdim=True)
    grad_scores = probabilities * (grad_probabilities - row)
    grad_query = torch.matmul(grad_scores, _wide(key_x)) * scale
    grad_key = torch.matmul(grad_scores.transpose(-2, -1), _wide(query)) * scale
    return (grad_query.to(query.dtype), _summed_heads(grad_key, key).to(key.dtype),
            _summed_heads(grad_value, value).to(value.dtype), grad_scores)


def _empty(device, dtype):
    return torch.empty(0, dtype=dtype, device=device)


def _offset(device):
    """The Philox offset's place in CUDA's outputs: the seed alone says the mask here."""
    return torch.zeros((), dtype=torch.int64, device=device)


def flash_attention(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,
                    scale=None):
    """``aten::_scaled_dot_product_flash_attention``: (output, logsumexp, cum_seq_q, cum_seq_k,
    max_q, max_k, rng_state, unused, debug_attn_mask); the cumulative lengths are CUDA's
    bookkeeping of variable-length batches, undefined for dense inputs as there."""
    if return_debug_mask:
        raise NotImplementedError("aten::_scaled_dot_product_flash_attention with return_debug_mask=True "
                                  f"has no kernel on {query.device.type}: cudashim computes the attention, "
                                  "not CUDA's debug mask")
    output, logsumexp, seed = _forward(query, key, value, None, dropout_p, is_causal, scale)
    return (output, logsumexp, None, None, query.size(-2), key.size(-2), seed, _offset(query.device),
            _empty(query.device, query.dtype))


def flash_attention_backward(grad_out, query, key, value, out, logsumexp, cum_seq_q, cum_seq_k,
                             max_q, max_k, dropout_p, is_causal, philox_seed, philox_offset, *,
                             scale=None):
    """``aten::_scaled_dot_product_flash_attention_backward``: (grad_query, grad_key, grad_value)."""
    return _backward(grad_out, query, key, value, None, out, logsumexp, philox_seed, dropout_p,
                     is_causal, scale)[:3]


def efficient_attention(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0,
                        is_causal=False, *, scale=None):
    """``aten::_scaled_dot_product_efficient_attention``: (output, log_sumexp, philox_seed,
    philox_offset); the log-sum-exp is empty unless asked for, as on CUDA."""
    output, logsumexp, seed = _forward(query, key, value, attn_bias, dropout_p, is_causal, scale)
    if not compute_log_sumexp:
        logsumexp = _empty(query.device, torch.float32)
    return output, logsumexp, seed, _offset(query.device)


def efficient_attention_backward(grad_out_, query, key, value, attn_bias, out, logsumexp,
                                 philox_seed, philox_offset, dropout_p, grad_input_mask,
                                 is_causal=False, *, scale=None):
    """``aten::_scaled_dot_product_efficient_attention_backward``: (grad_query, grad_key,
    grad_value, grad_bias); the bias's gradient is that of the scores, which autograd sums to
    the bias's shape."""
    bias = attn_bias if attn_bias is not None and attn_bias.numel() else None
    grad_query, grad_key, grad_value, grad_scores = _backward(
        grad_out_, query, key, value, bias, out, logsumexp, philox_seed, dropout_p, is_causal, scale)
    if bias is not None and grad_input_mask[3]:
        grad_bias = grad_scores.to(bias.dtype)
    else:                              # CUDA's undefined gradient: nothing reads it
        grad_bias = _empty(query.device, query.dtype)
    return grad_query, grad_key, grad_value, grad_bias


# op name -> its portable kernel
OPS = {
    "_scaled_dot_product_flash_attention": flash_attention,
    "_scaled_dot_product_flash_attention_backward": flash_attention_backward,
    "_scaled_dot_product_efficient_attention": efficient_attention,
    "_scaled_dot_product_efficient_attention_backward": efficient_attention_backward,
}
