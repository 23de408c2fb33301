"""apex.amp on torch.amp: ``initialize`` runs each model's forward under CUDA float16
autocast (which cudashim then computes in the target's fast dtype) and gives each loss a
dynamic loss scaler with apex's defaults; ``scale_loss`` scales, and on leaving unscales the
gradients, skipping the optimizer's next step and halving the scale when one overflowed.

Opt levels: O0 changes nothing; O1 and O2 both become autocast with float32 weights (O2's
float32 master weights are the weights themselves); O3 (pure float16, a speed baseline) is
refused.
"""

from __future__ import annotations

import contextlib
import functools
from typing import List

import torch

from cudashim.substitutes._refuse import refusal

from ._scaler import LossScaler

_scalers: List[LossScaler] = []
_OPT_LEVELS = ("O0", "O1", "O2", "O3")


def _listed(value):
    return (list(value), True) if isinstance(value, (list, tuple)) else ([value], False)


def _autocast_forward(model: torch.nn.Module) -> None:
    forward = model.forward

    @functools.wraps(forward)
    def forward_in_float16(*args, **kwargs):
        with torch.autocast("cuda", dtype=torch.float16):
            return forward(*args, **kwargs)

    model.forward = forward_in_float16


def initialize(models, optimizers=None, enabled=True, opt_level="O1", cast_model_type=None,
               patch_torch_functions=None, keep_batchnorm_fp32=None, master_weights=None,
               loss_scale=None, cast_model_outputs=None, num_losses=1, verbosity=1,
               min_loss_scale=None, max_loss_scale=2.0 ** 24):
    """Returns ``models`` and ``optimizers`` as given (the same objects), ready for amp."""
    if not enabled:
        return models if optimizers is None else (models, optimizers)
    if opt_level not in _OPT_LEVELS:
        raise RuntimeError(f"Unexpected optimization level {opt_level}. Options are 'O0', 'O1', "
                           f"'O2', 'O3'.")
    if opt_level == "O3":
        raise refusal("apex.amp.initialize(opt_level='O3')",
                      "O3 runs pure float16 as a speed baseline; use O1 or O2 (autocast)")
    model_list, _ = _listed(models)
    if opt_level != "O0":
        for model in model_list:
            _autocast_forward(model)
    scale = loss_scale if loss_scale is not None else ("dynamic" if opt_level != "O0" else 1.0)
    _scalers[:] = [LossScaler(scale, min_loss_scale=min_loss_scale, max_loss_scale=max_loss_scale)
                   for _ in range(num_losses)]
    if optimizers is None:
        return models
    for optimizer in _listed(optimizers)[0]:
        _skip_after_overflow(optimizer)
    return models, optimizers


def _skip_after_overflow(optimizer) -> None:
    step = optimizer.step

    @functools.wraps(step)
    def step_unless_overflowed(*args, **kwargs):
        if getattr(optimizer, "_amp_skip_next_step", False):
            optimizer._amp_skip_next_step = False
            return None
        return step(*args, **kwargs)

    optimizer.step = step_unless_overflowed


@contextlib.contextmanager
def scale_loss(loss, optimizers, loss_id=0, model=None, delay_unscale=False,
               delay_overflow_check=False):
    """``with amp.scale_loss(loss, optimizer) as scaled: scaled.backward()``."""
    if not _scalers:
        yield loss                                # amp.initialize was not called, or disabled
        return
    scaler = _scalers[loss_id]
    yield loss.float() * scaler.loss_scale()
    if delay_unscale:
        return
    overflowed = False
    for optimizer in _listed(optimizers)[0]:
        found = scaler.unscale(master_params(optimizer))
        optimizer._amp_skip_next_step = found
        overflowed |= found
    scaler.update(overflowed)


def master_params(optimizer):
    """The parameters the optimizer steps (apex's float32 master copies; here, the weights)."""
    for group in optimizer.param_groups:
        yield from group["params"]


def state_dict(destination=None):
    state = {} if destination is None else destination
    for index, scaler in enumerate(_scalers):
        state[f"loss_scaler{index}"] = scaler.state_dict()
    return state


def load_state_dict(state_dict):
    for index, scaler in enumerate(_scalers):
        saved = state_dict.get(f"loss_scaler{index}")
        if saved is not None:
            scaler.load_state_dict(saved)


# --- per-function casts -------------------------------------------------------------------------
def half_function(fn):
    """Run ``fn`` under CUDA float16 autocast."""
    @functools.wraps(fn)
    def in_half(*args, **kwargs):
        with torch.autocast("cuda", dtype=torch.float16):
            return fn(*args, **kwargs)
    return in_half


def float_function(fn):
    """Run ``fn`` in float32: autocast off, floating inputs cast up."""
    @functools.wraps(fn)
    def in_float(*args, **kwargs):
        cast = [a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args]
        with torch.autocast("cuda", enabled=False):
            return fn(*cast, **kwargs)
    return in_float


def promote_function(fn):
    """Run ``fn`` with floating inputs cast to the widest dtype among them."""
    @functools.wraps(fn)
    def promoted(*args, **kwargs):
        floats = [a.dtype for a in args if torch.is_tensor(a) and a.is_floating_point()]
        if not floats:
            return fn(*args, **kwargs)
        widest = functools.reduce(torch.promote_types, floats)
        return fn(*[a.to(widest) if torch.is_tensor(a) and a.is_floating_point() else a
                    for a in args], **kwargs)
    return promoted


def register_half_function(module, name):
    setattr(module, name, half_function(getattr(module, name)))


def register_float_function(module, name):
    setattr(module, name, float_function(getattr(module, name)))


def register_promote_function(module, name):
    setattr(module, name, promote_function(getattr(module, name)))
