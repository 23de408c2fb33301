"""Portable kernels for the ATen ops that only CUDA implements and torch itself calls on
every accelerator.

- ``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell`` and ``nn.GRUCell`` compute each step with a fused
  cell op (``aten::_thnn_fused_lstm_cell``, ``aten::_thnn_fused_gru_cell``) whenever the
  input is on CUDA, XPU or a PrivateUse1 device (``aten/src/ATen/native/RNN.cpp``). The
  backward ops their derivative formulas call are written here too, in the gate order and
  the workspace layout of CUDA's kernels, so autograd's formulas work unchanged.
- CUDA's fused attention (flash and memory-efficient, forward and backward), which context
  parallelism's ring attention and libraries call by name (``kernels/fused_attention.py``).
- ``nn.SyncBatchNorm`` on more than one rank computes its statistics and its backward with
  ``aten::batch_norm_stats``, ``..._gather_stats_with_counts``, ``..._elemt``,
  ``..._backward_reduce`` and ``..._backward_elemt`` (``torch/nn/modules/_functions.py``).

Those ops have CUDA kernels and no others: not even the host has one, so a target's own
host fallback cannot run them either, and the program dies at its first step on an
accelerator that does not write them (torchvulkan). Here each is written with plain tensor
ops on the target, in the dtypes CUDA's kernels return (statistics in float32 for float16
and bfloat16 inputs).

``OPS`` is the table: op name -> the function computing it. ``patches/kernel_gaps``
registers each for the target's dispatch key where the target has no kernel of its own.
"""

from __future__ import annotations

import torch

from . import fused_attention


def _gates(input_gates, hidden_gates, input_bias, hidden_bias):
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias + hidden_bias
    return gates


def fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """(hy, cy, workspace): the four gates in/forget/cell/out, activated, are the
    workspace, as CUDA's kernel stores them for the backward."""
    gates = _gates(input_gates, hidden_gates, input_bias, hidden_bias)
    in_gate, forget_gate, cell_gate, out_gate = gates.chunk(4, dim=1)
    in_gate, forget_gate, out_gate = in_gate.sigmoid(), forget_gate.sigmoid(), out_gate.sigmoid()
    cell_gate = cell_gate.tanh()
    cy = forget_gate * cx + in_gate * cell_gate
    hy = out_gate * cy.tanh()
    return hy, cy, torch.cat((in_gate, forget_gate, cell_gate, out_gate), dim=1)


def fused_lstm_cell_backward_impl(grad_hy, grad_cy, cx, cy, workspace, has_bias):
    """(grad of the gates, grad of cx, grad of the biases): the derivative of
    ``fused_lstm_cell`` through its workspace."""
    in_gate, forget_gate, cell_gate, out_gate = workspace.chunk(4, dim=1)
    tanh_cy = cy.tanh()
    if grad_hy is not None:
        grad_out_gate = grad_hy * tanh_cy
        grad_c = grad_hy * out_gate * (1 - tanh_cy * tanh_cy)
    else:
        grad_out_gate = torch.zeros_like(cy)
        grad_c = torch.zeros_like(cy)
    if grad_cy is not None:
        grad_c = grad_c + grad_cy
    grad_gates = torch.cat((
        grad_c * cell_gate * (1 - in_gate) * in_gate,
        grad_c * cx * (1 - forget_gate) * forget_gate,
        grad_c * in_gate * (1 - cell_gate * cell_gate),
        grad_out_gate * (1 - out_gate) * out_gate,
    ), dim=1)
    grad_bias = grad_gates.sum(0) if has_bias else _undefined_like(grad_gates)
    return grad_gates, grad_c * forget_gate, grad_bias


def fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """(hy, workspace): reset and update gates, the hidden part of the new gate, hx and the
    new gate, as CUDA's kernel stores them for the backward."""
    if input_bias is not None:
        input_gates = input_gates + input_bias
        hidden_gates = hidden_gates + hidden_bias
    input_reset, input_update, input_new = input_gates.chunk(3, dim=1)
    hidden_reset, hidden_update, hidden_new = hidden_gates.chunk(3, dim=1)
    reset_gate = (input_reset + hidden_reset).sigmoid()
    update_gate = (input_update + hidden_update).sigmoid()
    new_gate = (input_new + reset_gate * hidden_new).tanh()
    hy = new_gate + update_gate * (hx - new_gate)
    return hy, torch.cat((reset_gate, update_gate, hidden_new, hx, new_gate), dim=1)


def fused_gru_cell_backward(grad_hy, workspace, has_bias):
    """(grad of the input gates, of the hidden gates, of hx, of the input bias, of the
    hidden bias): the derivative of ``fused_gru_cell`` through its workspace."""
    reset_gate, update_gate, hidden_new, hx, new_gate = workspace.chunk(5, dim=1)
    grad_update = grad_hy * (hx - new_gate) * (1 - update_gate) * update_gate
    grad_input_new = grad_hy * (1 - update_gate) * (1 - new_gate * new_gate)
    grad_reset = grad_input_new * hidden_new * (1 - reset_gate) * reset_gate
    grad_input_gates = torch.cat((grad_reset, grad_update, grad_input_new), dim=1)
    grad_hidden_gates = torch.cat((grad_reset, grad_update, grad_input_new * reset_gate), dim=1)
    if has_bias:
        grad_input_bias, grad_hidden_bias = grad_input_gates.sum(0), grad_hidden_gates.sum(0)
    else:
        grad_input_bias = grad_hidden_bias = _undefined_like(grad_input_gates)
    return grad_input_gates, grad_hidden_gates, grad_hy * update_gate, grad_input_bias, grad_hidden_bias


# --- SyncBatchNorm: per-channel statistics (channels on dim 1) --------------------------------
def _per_channel(statistic, like):
    """A (C,) statistic shaped to broadcast over ``like`` (N, C, ...)."""
    return statistic.view(1, -1, *([1] * (like.dim() - 2)))


def _other_dims(tensor):
    return [0, *range(2, tensor.dim())]


def _opmath(tensor):
    return tensor.float() if tensor.dtype in (torch.float16, torch.bfloat16) else tensor


def batch_norm_stats(input, eps):
    """(mean, 1 / sqrt(biased variance + eps)) of each channel."""
    wide = _opmath(input)
    var, mean = torch.var_mean(wide, dim=_other_dims(wide), correction=0)
    return mean, (var + eps).rsqrt()


def batch_norm_gather_stats_with_counts(input, mean, invstd, running_mean, running_var,
                                        momentum, eps, counts):
    """The statistics of all ranks' inputs from each rank's (mean, invstd, count), rows of
    ``mean``/``invstd``; the running statistics move by ``momentum`` (unbiased variance)."""
    counts = counts.to(mean.dtype).view(-1, 1)
    total = counts.sum()
    global_mean = (counts * mean).sum(0) / total
    variance = 1 / (invstd * invstd) - eps                   # each rank's biased variance
    sum_of_squares = (counts * (variance + (mean - global_mean) ** 2)).sum(0)
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = sum_of_squares / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return global_mean, (sum_of_squares / total + eps).rsqrt()


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    out = (_opmath(input) - _per_channel(mean, input)) * _per_channel(invstd, input)
    if weight is not None:
        out = out * _per_channel(weight, input)
    if bias is not None:
        out = out + _per_channel(bias, input)
    return out.to(input.dtype)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    """(sum of dy, sum of dy * (x - mean), grad of weight, grad of bias) of each channel."""
    dims = _other_dims(input)
    grad = _opmath(grad_out)
    sum_dy = grad.sum(dims)
    sum_dy_xmu = (grad * (_opmath(input) - _per_channel(mean, input))).sum(dims)
    dtype = weight.dtype if weight is not None else input.dtype
    grad_weight = (sum_dy_xmu * invstd).to(dtype) if weight_g else _undefined_like(sum_dy)
    grad_bias = sum_dy.to(dtype) if bias_g else _undefined_like(sum_dy)
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    """The input's gradient, from the sums all ranks reduced and every rank's count."""
    total = count.sum().to(sum_dy.dtype)
    mean, invstd = _per_channel(mean, input), _per_channel(invstd, input)
    mean_dy, mean_dy_xmu = _per_channel(sum_dy / total, input), _per_channel(sum_dy_xmu / total, input)
    scale = invstd if weight is None else invstd * _per_channel(weight.to(invstd.dtype), input)
    grad = (_opmath(grad_out) - mean_dy - (_opmath(input) - mean) * invstd * invstd * mean_dy_xmu) * scale
    return grad.to(input.dtype)


def _undefined_like(tensor):
    """What stands for CUDA's undefined bias gradient: an empty tensor that nothing reads
    (the derivative formulas take it only where there is a bias)."""
    return tensor.new_empty(0)


# op name -> its portable kernel
OPS = {
    "_thnn_fused_lstm_cell": fused_lstm_cell,
    "_thnn_fused_lstm_cell_backward_impl": fused_lstm_cell_backward_impl,
    "_thnn_fused_gru_cell": fused_gru_cell,
    "_thnn_fused_gru_cell_backward": fused_gru_cell_backward,
    "batch_norm_stats": batch_norm_stats,
    "batch_norm_gather_stats_with_counts": batch_norm_gather_stats_with_counts,
    "batch_norm_elemt": batch_norm_elemt,
    "batch_norm_backward_reduce": batch_norm_backward_reduce,
    "batch_norm_backward_elemt": batch_norm_backward_elemt,
    **fused_attention.OPS,
}
