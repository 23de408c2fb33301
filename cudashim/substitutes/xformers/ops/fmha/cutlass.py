"""xformers.ops.fmha.cutlass: the cutlass kernel's names; they compute the stand-in's attention."""

from .common import AttentionBwOpBase, AttentionFwOpBase


class FwOp(AttentionFwOpBase):
    NAME = "cutlassF"


class BwOp(AttentionBwOpBase):
    NAME = "cutlassB"
