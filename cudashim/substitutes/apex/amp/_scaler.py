"""apex's dynamic loss scaler: start at 2**16, halve on an overflow, double after 2000 clean
steps, within [min_loss_scale, max_loss_scale]; a number instead of "dynamic" is static."""

from __future__ import annotations

from typing import Iterable, Optional

import torch


class LossScaler:
    def __init__(self, loss_scale="dynamic", init_scale=2.0 ** 16, scale_factor=2.0,
                 scale_window=2000, min_loss_scale: Optional[float] = None,
                 max_loss_scale: float = 2.0 ** 24):
        self.dynamic = loss_scale == "dynamic"
        self._scale = min(max_loss_scale, init_scale) if self.dynamic else float(loss_scale)
        self.scale_factor, self.scale_window = scale_factor, scale_window
        self.min_loss_scale, self.max_loss_scale = min_loss_scale, max_loss_scale
        self.unskipped = 0

    def loss_scale(self) -> float:
        return self._scale

    def unscale(self, params: Iterable[torch.Tensor]) -> bool:
        """Divide the gradients by the scale in place; whether any is inf or NaN."""
        by_kind = {}
        for param in params:
            if param.grad is not None:
                by_kind.setdefault((param.grad.device, param.grad.dtype), []).append(param.grad)
        found = False
        for (device, _), grads in by_kind.items():
            found_inf = torch.zeros(1, device=device)
            inv_scale = torch.full((1,), 1.0 / self._scale, device=device)
            torch._amp_foreach_non_finite_check_and_unscale_(grads, found_inf, inv_scale)
            found |= bool(found_inf.item())
        return found

    def update(self, overflowed: bool) -> None:
        if not self.dynamic:
            return
        if overflowed:
            self._scale /= self.scale_factor
            if self.min_loss_scale is not None:
                self._scale = max(self._scale, self.min_loss_scale)
            self.unskipped = 0
            return
        self.unskipped += 1
        if self.unskipped == self.scale_window:
            self._scale = min(self.max_loss_scale, self._scale * self.scale_factor)
            self.unskipped = 0

    def state_dict(self) -> dict:
        return {"loss_scale": self._scale, "unskipped": self.unskipped}

    def load_state_dict(self, state: dict) -> None:
        self._scale, self.unskipped = state["loss_scale"], state["unskipped"]
