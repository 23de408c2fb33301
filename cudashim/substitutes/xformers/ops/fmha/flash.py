"""xformers.ops.fmha.flash: the flash kernel's names; they compute the stand-in's attention."""

from .common import AttentionBwOpBase, AttentionFwOpBase


class FwOp(AttentionFwOpBase):
    NAME = "flashF"


class BwOp(AttentionBwOpBase):
    NAME = "flashB"
