"""The tensor shapes NCCL accepts in collectives that take several tensors.

NCCL checks only element counts: ``all_gather`` fills a list of 1-element tensors from a 0-d
one, ``gather`` and ``scatter`` likewise, and ``all_gather_into_tensor`` writes into a
stacked ``(world, *shape)`` output as into the concatenated one. Gloo and the other
libraries the program's ``"nccl"`` becomes want the shapes to match, so code written
against NCCL stops there (DeepSpeed's 1-bit backends gather a 0-d scale into
``torch.zeros(1)`` tensors). These wrappers hand the library views of the same memory in
the shape it wants, where only the shape differs; everything else reaches it unchanged.
"""

from __future__ import annotations

import functools
import inspect

import torch


def _like(tensors, shape):
    """``tensors`` with each one of the same element count as ``shape`` viewed in it."""
    count = shape.numel()
    return [t.view(shape) if t.shape != shape and t.numel() == count and t.is_contiguous() else t
            for t in tensors]


def _list_collective(list_name: str):
    """For ``all_gather(tensor_list, tensor)``, ``gather(tensor, gather_list)`` and
    ``scatter(tensor, scatter_list)``: the list takes the one tensor's shape."""
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def collective(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            tensors, tensor = bound.arguments.get(list_name), bound.arguments.get("tensor")
            if isinstance(tensor, torch.Tensor) and tensors:
                bound.arguments[list_name] = _like(tensors, tensor.shape)
            return original(*bound.args, **bound.kwargs)
        return collective
    return make


def _into_tensor(original):
    """``all_gather_into_tensor(output_tensor, input_tensor)``: NCCL takes any output with
    world-size times the input's elements (a stacked ``(world, *shape)`` one, SyncBatchNorm's
    ``(1, world * n)``); the output is handed over as the concatenation along the first
    dimension that it holds, a 0-d input as one element."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def all_gather_into_tensor(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        output, given = bound.arguments.get("output_tensor"), bound.arguments.get("input_tensor")
        if isinstance(output, torch.Tensor) and isinstance(given, torch.Tensor) and given.numel() \
                and output.is_contiguous() and given.is_contiguous() \
                and output.numel() % given.numel() == 0:
            if given.dim() == 0:
                given = bound.arguments["input_tensor"] = given.view(1)
            world = output.numel() // given.numel()
            concatenated = (world * given.shape[0], *given.shape[1:])
            if output.shape != concatenated:
                bound.arguments["output_tensor"] = output.view(concatenated)
        return original(*bound.args, **bound.kwargs)
    return all_gather_into_tensor


WRAPPERS = {
    "all_gather": _list_collective("tensor_list"),
    "gather": _list_collective("gather_list"),
    "scatter": _list_collective("scatter_list"),
    "all_gather_into_tensor": _into_tensor,
    "all_gather_single": _into_tensor,           # its new name (torch 2.13)
}
