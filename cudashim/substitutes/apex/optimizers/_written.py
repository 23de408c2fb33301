"""apex's fused optimizers that torch.optim has no twin for, written here tensor by tensor
on torch operations: LAMB and NovoGrad, with apex's arguments and order of operations. The
moments are kept in float32 whatever the parameters' dtype, as apex's kernels keep them."""

from __future__ import annotations

import torch

from ._torch_backed import as_groups, refuse_if


class FusedLAMB(torch.optim.Optimizer):
    """LAMB (You et al.) as apex computes it: the gradients are first clipped together to
    ``max_grad_norm``; each tensor then takes an Adam step (decoupled decay with
    ``adam_w_mode``, L2 otherwise) scaled by its trust ratio ||p|| / ||update||, applied
    where weight decay is on or ``use_nvlamb``."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
                 weight_decay=0.01, amsgrad=False, adam_w_mode=True, grad_averaging=True,
                 set_grad_none=True, max_grad_norm=1.0, use_nvlamb=False):
        refuse_if(amsgrad, "apex.optimizers.FusedLAMB(amsgrad=True)", "apex does not support it either")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging,
                        max_grad_norm=max_grad_norm)
        super().__init__(as_groups(params), defaults)
        self.adam_w_mode, self.use_nvlamb, self.set_grad_none = adam_w_mode, use_nvlamb, set_grad_none

    def zero_grad(self, set_to_none: bool = None):
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        grads = [p.grad for g in self.param_groups for p in g["params"] if p.grad is not None]
        if not grads:
            return loss
        global_norm = torch.linalg.vector_norm(
            torch.stack([torch.linalg.vector_norm(g.float()) for g in grads]))
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            clip = torch.clamp(global_norm / group["max_grad_norm"], min=1.0) \
                if group["max_grad_norm"] > 0 else torch.ones((), device=global_norm.device)
            for p in params:
                self._update(p, p.grad.float() / clip.to(p.device), group, beta1, beta2)
        return loss

    def _update(self, p, grad, group, beta1, beta2):
        state = self.state[p]
        if not state:
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
        weight, decay = p.float(), group["weight_decay"]
        if not self.adam_w_mode and decay:
            grad = grad + decay * weight
        m, v = state["exp_avg"], state["exp_avg_sq"]
        m.mul_(beta1).add_(grad, alpha=(1 - beta1) if group["grad_averaging"] else 1.0)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        step = group["step"]
        m_hat, v_hat = (m / (1 - beta1 ** step), v / (1 - beta2 ** step)) \
            if group["bias_correction"] else (m, v)
        update = m_hat / (v_hat.sqrt() + group["eps"])
        if self.adam_w_mode and decay:
            update = update + decay * weight
        ratio = torch.ones((), device=p.device)
        if self.use_nvlamb or decay:
            p_norm, u_norm = torch.linalg.vector_norm(weight), torch.linalg.vector_norm(update)
            ratio = torch.where((p_norm > 0) & (u_norm > 0), p_norm / u_norm, ratio)
        p.copy_(weight - group["lr"] * ratio * update)


class FusedNovoGrad(torch.optim.Optimizer):
    """NovoGrad (Ginsburg et al.) as apex documents it: the second moment is one number per
    tensor, a running mean of its squared gradient norm (started at the first norm unless
    ``init_zero``); with ``reg_inside_moment`` the weight decay goes into the first moment,
    otherwise into the update."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.0, amsgrad=False, reg_inside_moment=False, grad_averaging=True,
                 norm_type=2, init_zero=False, set_grad_none=True):
        refuse_if(amsgrad, "apex.optimizers.FusedNovoGrad(amsgrad=True)", "apex does not support it either")
        refuse_if(norm_type != 2, f"apex.optimizers.FusedNovoGrad(norm_type={norm_type})",
                  "only the L2 norm is provided")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps,
                        weight_decay=weight_decay, grad_averaging=grad_averaging)
        super().__init__(as_groups(params), defaults)
        self.reg_inside_moment, self.init_zero = reg_inside_moment, init_zero
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: bool = None):
        super().zero_grad(self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            group["step"] = group.get("step", 0) + 1
            for p in params:
                self._update(p, p.grad.float(), group)
        return loss

    def _update(self, p, grad, group):
        beta1, beta2 = group["betas"]
        step, decay = group["step"], group["weight_decay"]
        state = self.state[p]
        norm_sq = grad.pow(2).sum()
        if not state:
            state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros((), device=p.device) if self.init_zero else norm_sq.clone()
            if self.init_zero:
                state["exp_avg_sq"].mul_(beta2).add_(norm_sq, alpha=1 - beta2)
        else:
            state["exp_avg_sq"].mul_(beta2).add_(norm_sq, alpha=1 - beta2)
        # Started at the first norm, the running mean carries no bias toward zero to correct.
        unbias = group["bias_correction"] and self.init_zero
        v = state["exp_avg_sq"] / (1 - beta2 ** step) if unbias else state["exp_avg_sq"]
        weight = p.float()
        normalized = grad / (v.sqrt() + group["eps"])
        if self.reg_inside_moment and decay:
            normalized = normalized + decay * weight
        m = state["exp_avg"]
        m.mul_(beta1).add_(normalized, alpha=(1 - beta1) if group["grad_averaging"] else 1.0)
        update = m / (1 - beta1 ** step) if group["bias_correction"] else m.clone()
        if not self.reg_inside_moment and decay:
            update = update + decay * weight
        p.copy_(weight - group["lr"] * update)
