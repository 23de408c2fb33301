"""CUDA devices inside TorchScript graphs, rewritten to the target's.

Compiled TorchScript runs in C++, out of reach of every Python patch. The compiler turns
``torch.device("cuda")``, ``x.to("cuda:0")`` and ``torch.zeros(..., device="cuda")`` into
Device constants, ``torch.device("cuda", 0)`` into an ``aten::device`` call on constants and
``x.cuda()`` into an ``aten::cuda`` node. ``retarget`` rewrites each to the target's device
in place, before the graph first runs (TorchScript optimises a copy on the first call, so
later edits would not be seen). A device computed at run time from a variable string is
out of reach and stays as it is.
"""

from __future__ import annotations

from typing import Callable

import torch

_REAL_DEVICE = torch._C.device


def names_cuda(graph) -> bool:
    """Whether the graph (its nested blocks included) names a CUDA device."""
    return any(_cuda_constant(node) for node in graph.findAllNodes("prim::Constant")) or \
        any(_constant_device(node) is not None for node in graph.findAllNodes("aten::device")) or \
        bool(graph.findAllNodes("aten::cuda"))


def retarget(graph, translate: Callable) -> int:
    """Rewrite the graph's CUDA devices with ``translate``; return how many were rewritten."""
    rewritten = 0
    for node in graph.findAllNodes("prim::Constant"):
        device = _cuda_constant(node)
        if device is not None:
            node.s_("value", str(translate(device)))
            rewritten += 1
    for node in graph.findAllNodes("aten::device"):
        device = _constant_device(node)
        if device is not None:
            constant = _constant_before(graph, node, translate(device))
            node.output().replaceAllUsesWith(constant)
            node.destroy()
            rewritten += 1
    for node in graph.findAllNodes("aten::cuda"):
        # aten::cuda(self) is self.to(<the current CUDA device>): the prim overload of
        # to(self, device, dtype=None, non_blocking=False, copy=False).
        arguments = [node.input(), _constant_before(graph, node, translate("cuda")),
                     _constant_before(graph, node, None), _constant_before(graph, node, False),
                     _constant_before(graph, node, False)]
        to = graph.create("aten::to", arguments)
        to.insertBefore(node)
        to.output().setType(node.output().type())
        node.output().replaceAllUsesWith(to.output())
        node.destroy()
        rewritten += 1
    return rewritten


def retarget_with_callees(graph, translate: Callable) -> int:
    """``retarget``, and when a function or class method this graph calls names CUDA, inline
    the callees first (TorchScript inlines them on the first run anyway) and retarget them
    too. A graph that names no CUDA device, itself or through its callees, is left as is."""
    rewritten = retarget(graph, translate) if names_cuda(graph) else 0
    probe = graph.copy()
    torch._C._jit_pass_inline(probe)
    if names_cuda(probe):
        torch._C._jit_pass_inline(graph)
        rewritten += retarget(graph, translate)
    return rewritten


def _cuda_constant(node):
    output = node.output()
    if output.type().kind() != "DeviceObjType":
        return None
    device = output.toIValue()
    return device if device.type == "cuda" else None


def _constant_device(node):
    """The CUDA device an ``aten::device`` call on constant arguments makes, or None."""
    inputs = list(node.inputs())
    if not inputs or any(value.node().kind() != "prim::Constant" for value in inputs):
        return None
    arguments = [value.toIValue() for value in inputs]
    if not isinstance(arguments[0], str):
        return None
    try:
        device = _REAL_DEVICE(*arguments)
    except (RuntimeError, TypeError):
        return None                  # left for TorchScript to report at run time, as it would
    return device if device.type == "cuda" else None


def _constant_before(graph, node, value):
    constant = graph.insertConstant(value)
    constant.node().moveBefore(node)
    return constant
