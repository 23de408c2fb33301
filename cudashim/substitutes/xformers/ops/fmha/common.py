"""xformers.ops.fmha.common: the kernel-choice classes programs name (``op=``)."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional


@dataclasses.dataclass
class Inputs:
    query: Any
    key: Any
    value: Any
    attn_bias: Any = None
    p: float = 0.0
    scale: Optional[float] = None


class AttentionFwOpBase:
    """A forward kernel of xformers; here every one computes the same attention."""

    NAME = "cudashim"
    SUPPORTED_DEVICES = frozenset({"cpu", "cuda", "xpu", "npu", "hpu", "mps"})

    @classmethod
    def supports(cls, inputs) -> bool:
        return True

    @classmethod
    def not_supported_reasons(cls, inputs) -> list:
        return []

    @classmethod
    def is_available(cls) -> bool:
        return True


class AttentionBwOpBase(AttentionFwOpBase):
    """A backward kernel of xformers; autograd runs the backward here."""


AttentionOp = tuple
