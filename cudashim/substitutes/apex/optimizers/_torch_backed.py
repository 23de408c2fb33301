"""apex's fused optimizers that are torch.optim optimizers with other argument names."""

from __future__ import annotations

import inspect

import torch

from cudashim.substitutes._refuse import refusal

_WAY_OUT = "use the torch.optim optimizer it follows"
_ADAM_DECOUPLES = "decoupled_weight_decay" in inspect.signature(torch.optim.Adam.__init__).parameters


def fast_kernel(params) -> dict:
    """``fused=True`` where torch has fused kernels for every parameter's device, else
    ``foreach=True``: the multi-tensor form apex's kernels are."""
    from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

    devices = {p.device.type for group in params for p in group["params"]}
    fused = devices <= set(_get_fused_kernels_supported_devices())
    return {"fused": True} if fused else {"foreach": True}


def as_groups(params):
    params = list(params)
    if params and not isinstance(params[0], dict):
        params = [{"params": params}]
    return [dict(group, params=list(group["params"])) for group in params]


def refuse_if(condition: bool, api: str, why: str) -> None:
    if condition:
        raise refusal(api, f"{why}; {_WAY_OUT}")


class FusedAdam(torch.optim.Adam):
    """apex.optimizers.FusedAdam: torch's Adam with decoupled weight decay (AdamW,
    ``adam_w_mode=True``, the default) or L2 decay (``adam_w_mode=False``), on torch's fused
    kernel."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 adam_w_mode=True, weight_decay=0.0, amsgrad=False, set_grad_none=True,
                 capturable=False, master_weights=False):
        refuse_if(amsgrad, "apex.optimizers.FusedAdam(amsgrad=True)", "apex does not support it either")
        refuse_if(not bias_correction, "apex.optimizers.FusedAdam(bias_correction=False)",
                  "torch's Adam always corrects the bias")
        refuse_if(master_weights, "apex.optimizers.FusedAdam(master_weights=True)",
                  "keep float32 parameters under torch.autocast instead")
        refuse_if(adam_w_mode and not _ADAM_DECOUPLES, "apex.optimizers.FusedAdam",
                  f"torch {torch.__version__}'s Adam has no decoupled_weight_decay (torch>=2.6)")
        groups = as_groups(params)
        decoupled = {"decoupled_weight_decay": True} if adam_w_mode else {}
        super().__init__(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         **decoupled, **fast_kernel(groups))
        self.adam_w_mode, self.set_grad_none = adam_w_mode, set_grad_none

    def zero_grad(self, set_to_none: bool = None):
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)


class FusedSGD(torch.optim.SGD):
    """apex.optimizers.FusedSGD: torch's SGD on its fused kernel."""

    def __init__(self, params, lr=0.001, momentum=0.0, dampening=0.0, weight_decay=0.0,
                 nesterov=False, wd_after_momentum=False, materialize_master_grads=True,
                 set_grad_none=False):
        refuse_if(wd_after_momentum, "apex.optimizers.FusedSGD(wd_after_momentum=True)",
                  "torch's SGD applies weight decay before momentum")
        groups = as_groups(params)
        super().__init__(groups, lr=lr, momentum=momentum, dampening=dampening,
                         weight_decay=weight_decay, nesterov=nesterov, **fast_kernel(groups))
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: bool = None):
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)


class FusedAdagrad(torch.optim.Adagrad):
    """apex.optimizers.FusedAdagrad: torch's Adagrad (L2 weight decay)."""

    def __init__(self, params, lr=1e-2, eps=1e-10, weight_decay=0.0, set_grad_none=True,
                 adagrad_w_mode=False):
        refuse_if(adagrad_w_mode, "apex.optimizers.FusedAdagrad(adagrad_w_mode=True)",
                  "torch's Adagrad has L2 weight decay only")
        groups = as_groups(params)
        super().__init__(groups, lr=lr, eps=eps, weight_decay=weight_decay, **fast_kernel(groups))
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: bool = None):
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)
