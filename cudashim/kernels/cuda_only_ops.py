"""Portable kernels for the ATen ops that only CUDA implements and torch itself calls on
every accelerator.

``nn.LSTM``, ``nn.GRU``, ``nn.LSTMCell`` and ``nn.GRUCell`` compute each step with a fused
cell op (``aten::_thnn_fused_lstm_cell``, ``aten::_thnn_fused_gru_cell``) whenever the input
is on CUDA, XPU or a PrivateUse1 device (``aten/src/ATen/native/RNN.cpp``). Those ops have
CUDA kernels and no others: not even the host has one, so a target's own host fallback
cannot run them either, and a recurrent model dies at its first step on an accelerator that
does not write them (torchvulkan). Here each op and the backward op its derivative formula
calls are written with plain tensor ops on the target, in the gate order and the workspace
layout of CUDA's kernels, so autograd's formulas for the fused ops work unchanged.

``OPS`` is the table: op name -> the function computing it. ``patches/kernel_gaps``
registers each for the target's dispatch key where the target has no kernel of its own.
"""

from __future__ import annotations

import torch


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
}
