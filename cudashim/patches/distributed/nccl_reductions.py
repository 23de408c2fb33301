"""NCCL's average of integer tensors, on the library NCCL became.

NCCL averages integer tensors (``ReduceOp.AVG``: the sum divided by the group's size,
truncated). Gloo divides in floating point and cannot write the quotient back ("result
type Float can't be cast to the desired output type Long"). Code written against NCCL
averages counts this way: Lightning syncs the batch sizes behind its logged metrics with
AVG, its backend being "nccl". On a group made for an NCCL request, an integer AVG runs as
SUM on the library, and the output is then divided as NCCL divides. Everything else
reaches the library unchanged.

The division needs the sum, so an asynchronous integer average completes before the call
returns (its work is returned, already done).
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch.distributed import ReduceOp


def _averaging_integers(output_name: str, made_for_nccl, c10d):
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def collective(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            output, group = bound.arguments.get(output_name), bound.arguments.get("group")
            if not (bound.arguments.get("op") == ReduceOp.AVG and _integer(output) and made_for_nccl(group)):
                return original(*args, **kwargs)
            bound.arguments["op"] = ReduceOp.SUM
            work = original(*bound.args, **bound.kwargs)
            if work is not None:
                work.wait()
            if _receives(bound, c10d):
                output.copy_(torch.div(output, c10d.get_world_size(group), rounding_mode="trunc"))
            return work
        return collective
    return make


def _integer(tensor) -> bool:
    return isinstance(tensor, torch.Tensor) and tensor.dtype is not torch.bool and \
        not tensor.is_floating_point() and not tensor.is_complex()


def _receives(bound, c10d) -> bool:
    """Whether this rank holds the result: every rank, except for ``reduce``'s destination."""
    if "dst" not in bound.signature.parameters:
        return True
    dst, group_dst = bound.arguments.get("dst"), bound.arguments.get("group_dst")
    if dst is None:
        dst = c10d.get_global_rank(bound.arguments.get("group") or c10d.group.WORLD, group_dst or 0)
    return c10d.get_rank() == dst


def wrappers(c10d, made_for_nccl) -> dict:
    """{collective name: make(original)} for each reducing collective this torch has."""
    outputs = {"all_reduce": "tensor", "reduce": "tensor", "reduce_scatter": "output",
               "reduce_scatter_tensor": "output", "reduce_scatter_single": "output"}
    return {name: _averaging_integers(output, made_for_nccl, c10d)
            for name, output in outputs.items() if hasattr(c10d, name)}
