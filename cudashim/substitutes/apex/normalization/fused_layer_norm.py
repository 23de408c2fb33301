"""apex.normalization.fused_layer_norm: LayerNorm and RMSNorm on torch's own kernels.

The ``Mixed`` variants keep float32 weights for half-precision inputs and return the input's
dtype, as apex's mixed kernels do; the plain ones compute in the input's dtype, as
``torch.nn.LayerNorm`` does. ``memory_efficient`` trades memory for recomputation in apex's
kernels and changes nothing in the result, so it is accepted.
"""

from __future__ import annotations

import numbers

import torch
import torch.nn.functional as F


def _shape(normalized_shape):
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(normalized_shape)


def fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False):
    return F.layer_norm(input, _shape(normalized_shape), weight, bias, eps)


def fused_layer_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    return F.layer_norm(input, _shape(normalized_shape), None, None, eps)


def fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    return F.rms_norm(input, _shape(normalized_shape), weight, eps)


def fused_rms_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    return F.rms_norm(input, _shape(normalized_shape), None, eps)


def mixed_dtype_fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6,
                                        memory_efficient=False):
    out = F.layer_norm(input.float(), _shape(normalized_shape), weight.float(),
                       None if bias is None else bias.float(), eps)
    return out.to(input.dtype)


def mixed_dtype_fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6,
                                      memory_efficient=False):
    return F.rms_norm(input.float(), _shape(normalized_shape), weight.float(), eps).to(input.dtype)


class _OnTorchKernels(torch.autograd.Function):
    """apex's normalization functions are autograd Functions that code calls as ``.apply``
    and inspects (Megatron reads ``forward``'s arguments for ``memory_efficient``). Here
    each ``forward`` runs the torch function above with autograd on, and ``backward``
    differentiates through what it recorded: torch's own kernels are the fused ones."""

    @staticmethod
    def _run(ctx, compute, tensors, settings):
        inputs = [None if t is None else t.detach().requires_grad_(needed)
                  for t, needed in zip(tensors, ctx.needs_input_grad)]
        with torch.enable_grad():
            output = compute(*inputs, *settings)
        ctx.recorded, ctx.settings = (output, inputs), len(settings)
        return output.detach()

    @staticmethod
    def backward(ctx, grad_output):
        output, inputs = ctx.recorded
        wanted = [t for t in inputs if t is not None and t.requires_grad]
        # The recording lives as long as this node (``retain_graph`` may call it again),
        # as apex's saved tensors do.
        grads = iter(torch.autograd.grad(output, wanted, grad_output, retain_graph=True) if wanted else ())
        return (*(next(grads) if t is not None and t.requires_grad else None for t in inputs),
                *(None,) * ctx.settings)


class FusedLayerNormAffineFunction(_OnTorchKernels):
    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient=False):
        return _OnTorchKernels._run(ctx, fused_layer_norm_affine, (input, weight, bias),
                                    (normalized_shape, eps, memory_efficient))


class FusedLayerNormAffineMixedDtypesFunction(_OnTorchKernels):
    @staticmethod
    def forward(ctx, input, weight, bias, normalized_shape, eps, memory_efficient=False):
        return _OnTorchKernels._run(ctx, mixed_dtype_fused_layer_norm_affine, (input, weight, bias),
                                    (normalized_shape, eps, memory_efficient))


class FusedLayerNormFunction(_OnTorchKernels):
    @staticmethod
    def forward(ctx, input, normalized_shape, eps, memory_efficient=False):
        return _OnTorchKernels._run(ctx, fused_layer_norm, (input,), (normalized_shape, eps, memory_efficient))


class FusedRMSNormAffineFunction(_OnTorchKernels):
    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps, memory_efficient=False):
        return _OnTorchKernels._run(ctx, fused_rms_norm_affine, (input, weight),
                                    (normalized_shape, eps, memory_efficient))


class FusedRMSNormAffineMixedDtypesFunction(_OnTorchKernels):
    @staticmethod
    def forward(ctx, input, weight, normalized_shape, eps, memory_efficient=False):
        return _OnTorchKernels._run(ctx, mixed_dtype_fused_rms_norm_affine, (input, weight),
                                    (normalized_shape, eps, memory_efficient))


class FusedRMSNormFunction(_OnTorchKernels):
    @staticmethod
    def forward(ctx, input, normalized_shape, eps, memory_efficient=False):
        return _OnTorchKernels._run(ctx, fused_rms_norm, (input,), (normalized_shape, eps, memory_efficient))


class FusedLayerNorm(torch.nn.LayerNorm):
    """apex.normalization.FusedLayerNorm: torch.nn.LayerNorm."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient


class FusedRMSNorm(torch.nn.RMSNorm):
    """apex.normalization.FusedRMSNorm: torch.nn.RMSNorm."""

    def __init__(self, normalized_shape, eps=1e-5, elementwise_affine=True, memory_efficient=False):
        super().__init__(normalized_shape, eps=eps, elementwise_affine=elementwise_affine)
        self.memory_efficient = memory_efficient


class MixedFusedLayerNorm(FusedLayerNorm):
    """Float32 weights, the input's dtype out."""

    def forward(self, input):
        if not self.elementwise_affine:
            return super().forward(input)
        return mixed_dtype_fused_layer_norm_affine(input, self.weight, self.bias,
                                                   self.normalized_shape, self.eps)


class MixedFusedRMSNorm(FusedRMSNorm):
    """Float32 weights, the input's dtype out."""

    def forward(self, input):
        if not self.elementwise_affine:
            return super().forward(input)
        return mixed_dtype_fused_rms_norm_affine(input, self.weight, self.normalized_shape, self.eps)
