"""cudashim's stand-in for ``amp_C``, apex's multi-tensor CUDA kernels, on ``torch._foreach_*``.

Each op takes ``(chunk_size, noop_flag, tensor_lists, *args)`` as apex's do and sets
``noop_flag`` to 1 when it meets an inf or NaN, so callers that skip a step on it still do.
Kernels with no torch equivalent raise an ImportError naming the way out.
"""

from __future__ import annotations

import torch

from cudashim.substitutes._refuse import refusing_getattr


def _flag_non_finite(noop_flag, tensors) -> None:
    if any(not bool(torch.isfinite(t).all()) for t in tensors):
        noop_flag.fill_(1)


def multi_tensor_l2norm(chunk_size, noop_flag, tensor_lists, per_tensor=False, *args):
    """(the L2 norm of every tensor together, the norm of each when ``per_tensor``)."""
    tensors = tensor_lists[0]
    norms = [torch.linalg.vector_norm(t.float()) for t in tensors]
    each = torch.stack(norms) if norms else torch.zeros(0)
    total = torch.linalg.vector_norm(each).reshape(1) if norms else torch.zeros(1)
    if not bool(torch.isfinite(total).all()):
        noop_flag.fill_(1)
    return total, (each if per_tensor else torch.zeros(0, device=total.device))


def multi_tensor_scale(chunk_size, noop_flag, tensor_lists, scale):
    """out[i] = in[i] * scale, for tensor_lists = [in, out]."""
    sources, targets = tensor_lists[0], tensor_lists[1]
    _flag_non_finite(noop_flag, sources)
    for source, target in zip(sources, targets):
        target.copy_(source.float() * scale)


def multi_tensor_axpby(chunk_size, noop_flag, tensor_lists, a, b, arg_to_check):
    """out[i] = a * x[i] + b * y[i], for tensor_lists = [x, y, out]; ``arg_to_check`` says
    which inputs are checked for inf/NaN: 0 (x), 1 (y), -1 (both)."""
    xs, ys, outs = tensor_lists
    checked = {0: xs, 1: ys}.get(arg_to_check, list(xs) + list(ys))
    _flag_non_finite(noop_flag, checked)
    for x, y, out in zip(xs, ys, outs):
        out.copy_(a * x.float() + b * y.float())


_WAY_OUT = ("use the torch.optim optimizer with fused=True or foreach=True, "
            "or the apex.optimizers stand-ins")
__getattr__ = refusing_getattr(__name__, {name: _WAY_OUT for name in (
    "multi_tensor_adam", "multi_tensor_adam_capturable", "multi_tensor_adam_capturable_master",
    "multi_tensor_sgd", "multi_tensor_lamb", "multi_tensor_lamb_mp", "multi_tensor_novograd",
    "multi_tensor_adagrad", "multi_tensor_lamb_stage1_cuda", "multi_tensor_lamb_stage2_cuda",
    "multi_tensor_l2norm_mp", "multi_tensor_l2norm_scale", "multi_tensor_unscale_l2norm",
    "update_scale_hysteresis")})
