"""NCCL's averages (``ReduceOp.AVG``), on the library NCCL became.

NCCL averages every tensor it reduces (the sum over the group divided by its size, truncated
for integers). Gloo's average depends on the torch it comes with:

- torch 2.7 and earlier refuse AVG in ``all_reduce`` and ``reduce`` ("Cannot use ReduceOp.AVG
  with Gloo"), and their ``reduce_scatter_tensor`` returns the sum, without a word;
- later releases divide in floating point, so they still cannot write an integer quotient back
  ("result type Float can't be cast to the desired output type Long").

Code written against NCCL averages both ways: metrics and losses averaged over the ranks, FSDP's
float32 gradient reduce-scatter, Lightning's synced batch sizes (integers, its backend being
"nccl"). On a group made for an NCCL request, AVG therefore runs as SUM on the library, and the
output is then divided as NCCL divides, on every torch. Everything else reaches the library
unchanged; a group the program made for gloo itself keeps gloo's answers.

The division needs the sum, so an asynchronous average completes before the call returns (its
work is returned, already done).

Gloo in torch 2.7 and earlier has no ``reduce_scatter`` of a list of tensors either ("ProcessGroupGloo
does not support reduce_scatter"), only the single-tensor form. On a group made for an NCCL
request the list, one tensor per rank of the output's size, is then reduced as one tensor.
"""

from __future__ import annotations

import functools
import inspect

import torch
from torch.distributed import ReduceOp


def _averaging(output_name: str, made_for_nccl, c10d):
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def collective(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            output, group = bound.arguments.get(output_name), bound.arguments.get("group")
            if not (bound.arguments.get("op") == ReduceOp.AVG and _averageable(output) and made_for_nccl(group)):
                return original(*args, **kwargs)
            bound.arguments["op"] = ReduceOp.SUM
            work = original(*bound.args, **bound.kwargs)
            if work is not None:
                work.wait()
            if _receives(bound, c10d):
                _divide(output, c10d.get_world_size(group))
            return work
        return collective
    return make


def _averageable(tensor) -> bool:
    """What NCCL averages: a tensor of numbers (booleans have no average)."""
    return isinstance(tensor, torch.Tensor) and tensor.dtype is not torch.bool


def _divide(output, size: int) -> None:
    """``output`` divided by the group's size in place, as NCCL divides its sum."""
    if output.is_floating_point() or output.is_complex():
        output.div_(size)
    else:
        output.copy_(torch.div(output, size, rounding_mode="trunc"))


def _receives(bound, c10d) -> bool:
    """Whether this rank holds the result: every rank, except for ``reduce``'s destination."""
    if "dst" not in bound.signature.parameters:
        return True
    dst, group_dst = bound.arguments.get("dst"), bound.arguments.get("group_dst")
    if dst is None:
        dst = c10d.get_global_rank(bound.arguments.get("group") or c10d.group.WORLD, group_dst or 0)
    return c10d.get_rank() == dst


def _reduce_scatter_of_one_tensor(made_for_nccl, c10d):
    """``reduce_scatter(output, input_list)`` as ``reduce_scatter_tensor`` of the list laid end
    to end, where the library refuses the list form (and torch refuses before it sends
    anything). ``c10d.reduce_scatter_tensor`` is called as patched, averages and issue order
    included."""
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def collective(*args, **kwargs):
            try:
                return original(*args, **kwargs)
            except RuntimeError as error:
                bound = signature.bind(*args, **kwargs)
                output, inputs = bound.arguments.get("output"), bound.arguments.get("input_list")
                if LACKS_LIST_REDUCE_SCATTER not in str(error) or not made_for_nccl(bound.arguments.get("group")) \
                        or not _one_per_rank(output, inputs, c10d, bound.arguments.get("group")):
                    raise
            laid_out = torch.cat([tensor.reshape(-1) for tensor in inputs])
            return c10d.reduce_scatter_tensor(output, laid_out, **{
                name: value for name, value in bound.arguments.items()
                if name not in ("output", "input_list")})
        return collective
    return make


# torch's refusal where its gloo has no list-form reduce_scatter (torch 2.7 and earlier).
LACKS_LIST_REDUCE_SCATTER = "does not support reduce_scatter"


def _one_per_rank(output, inputs, c10d, group) -> bool:
    """Whether ``inputs`` is one tensor per rank, each of ``output``'s size and dtype."""
    return isinstance(output, torch.Tensor) and isinstance(inputs, (list, tuple)) \
        and len(inputs) == c10d.get_world_size(group) and all(
            isinstance(tensor, torch.Tensor) and tensor.numel() == output.numel()
            and tensor.dtype == output.dtype for tensor in inputs)


def served_forms(c10d, made_for_nccl) -> dict:
    """{collective name: make(original)} for each collective form the library may lack,
    applied outside every other wrapper of that name."""
    return {"reduce_scatter": _reduce_scatter_of_one_tensor(made_for_nccl, c10d)} \
        if hasattr(c10d, "reduce_scatter") and hasattr(c10d, "reduce_scatter_tensor") else {}


def wrappers(c10d, made_for_nccl) -> dict:
    """{collective name: make(original)} for each reducing collective this torch has."""
    outputs = {"all_reduce": "tensor", "reduce": "tensor", "reduce_scatter": "output",
               "reduce_scatter_tensor": "output", "reduce_scatter_single": "output"}
    return {name: _averaging(output, made_for_nccl, c10d)
            for name, output in outputs.items() if hasattr(c10d, name)}
