"""A recorded capture turned into a replay: each op rerun into the memory it wrote at capture.

A CUDA graph replays into fixed addresses, so the tensors a program holds from the capture see
each replay's results. Here every step keeps the tensors it had, and each kind of step is
replayed for what it did to memory:

- a view (its outputs alias its inputs) or a question about metadata did nothing to memory:
  nothing to do, the view still looks at the memory its base is rewritten into;
- an op allocating memory it does not fill (``empty``, ``new_empty``): nothing to do either;
- an op writing into its arguments (``add_``, ``copy_``, ``out=``): rerun as recorded;
- an op returning new memory: rerun through its ``out=`` overload into the tensors it returned
  at capture, or, without one, rerun and copied into them.

The ops run as the capture saw them, below autograd and autocast (their work was recorded
after both), with no Python in between but one loop over pre-resolved kernels.
"""

from __future__ import annotations

import functools
from typing import Callable, List, Optional, Tuple

import torch
from torch.utils import _pytree as pytree

from .recording import Step

aten = torch.ops.aten

# Ops that allocate without writing: a capture's allocation is already held.
_ALLOCATES_ONLY = frozenset({aten.empty.memory_format, aten.empty_like.default, aten.empty_strided.default,
                             aten.new_empty.default, aten.new_empty_strided.default,
                             aten.empty_permuted.default})

# Replay runs as the kernels were reached at capture: past autograd, ADInplaceOrView and
# autocast (and functorch's layers), whose work the recording already holds.
_ABOVE_THE_KERNELS = (torch._C._dispatch_keyset_full()
                      - torch._C._dispatch_keyset_full_after(torch._C.DispatchKey.ADInplaceOrView))

# The ops whose ``out=`` kernels are the functional kernels' own (torch's core ATen IR and
# its pointwise ops, generated from one structured kernel); other ``out=`` kernels may compose
# other ops and reallocate on the way (``mse_loss.out`` does), so those ops are rerun.
_OUT_KERNELS_GENERATED = frozenset({torch.Tag.core, torch.Tag.pointwise})

Call = Tuple[Callable, tuple, dict]


def replay_program(steps: List[Step]) -> Callable[[], None]:
    """A function rerunning ``steps`` into the memory they wrote at capture."""
    calls = [call for call in map(_replay_call, steps) if call is not None]

    def replay() -> None:
        with torch._C._ExcludeDispatchKeyGuard(_ABOVE_THE_KERNELS):
            for kernel, args, kwargs in calls:
                kernel(*args, **kwargs)

    replay.calls = calls                    # for debug_dump and the tests
    return replay


def _kernel(func) -> Callable:
    """The op's C++ entry point, one Python frame shorter than ``OpOverload.__call__``."""
    return getattr(func, "_op", func)


def _replay_call(step: Step) -> Optional[Call]:
    if not any(step.fresh):
        # Nothing new: a view, a metadata question, or a write into its arguments.
        return (_kernel(step.func), step.args, step.kwargs) if step.writes else None
    if step.func in _ALLOCATES_ONLY and not step.writes:
        return None
    if not step.writes and all(step.fresh):
        into = _out_call(step)
        if into is not None:
            return into
    return (_rerun_and_copy(step), (), {})


def _out_call(step: Step) -> Optional[Call]:
    """The step as a call of its ``out=`` overload into its outputs, where that overload is
    found to compute what the op computes: an ``out=`` kernel is not always the functional
    one (``mse_loss.out`` with a reduction writes the unreduced loss), so each is tried
    once, on the step's own arguments, into scratch memory, against the op itself. Random
    ops cannot be compared and are rerun instead, as are ``out=`` kernels that reallocate
    their output on the way."""
    overload, names = _out_overload_and_names(step.func)
    if overload is None or len(names) != len(step.outputs) or \
            torch.Tag.nondeterministic_seeded in step.func.tags or \
            not _OUT_KERNELS_GENERATED.intersection(step.func.tags):
        return None
    with torch._C._ExcludeDispatchKeyGuard(_ABOVE_THE_KERNELS):
        scratch = [torch.empty_strided(o.shape, o.stride(), dtype=o.dtype, device=o.device)
                   for o in step.outputs]
        memory = [t.untyped_storage().data_ptr() for t in scratch]
        overload(*step.args, **step.kwargs, **dict(zip(names, scratch)))
        if memory != [t.untyped_storage().data_ptr() for t in scratch]:
            return None                  # it reallocated its output: not into fixed memory
        expected = [t for t in pytree.tree_leaves(step.func(*step.args, **step.kwargs))
                    if isinstance(t, torch.Tensor)]
    same = len(expected) == len(scratch) and all(
        a.shape == b.shape and a.stride() == b.stride() and a.dtype == b.dtype
        and torch.equal(torch.nan_to_num(a), torch.nan_to_num(b)) for a, b in zip(scratch, expected))
    return (_kernel(overload), step.args, {**step.kwargs, **dict(zip(names, step.outputs))}) if same else None


def _rerun_and_copy(step: Step) -> Callable[[], None]:
    kernel, args, kwargs = _kernel(step.func), step.args, step.kwargs
    into = [(index, tensor) for index, (tensor, fresh) in enumerate(zip(step.outputs, step.fresh)) if fresh]

    def rerun() -> None:
        result = kernel(*args, **kwargs)
        flat = [t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor)]
        for index, tensor in into:
            tensor.copy_(flat[index])
    return rerun


@functools.lru_cache(maxsize=None)
def _out_overload_and_names(func) -> Tuple[Optional[torch._ops.OpOverload], Optional[Tuple[str, ...]]]:
    """The ``out=`` overload taking exactly ``func``'s arguments, and its out arguments' names."""
    schema = func._schema
    if not schema.returns or any(not isinstance(r.type, torch.TensorType) for r in schema.returns):
        return None, None
    wanted = [(a.name, str(a.type)) for a in schema.arguments]
    packet = func.overloadpacket
    for name in packet.overloads():
        candidate = getattr(packet, name)
        arguments = candidate._schema.arguments
        outs = [a for a in arguments if a.is_out]
        ins = [(a.name, str(a.type)) for a in arguments if not a.is_out]
        if outs and ins == wanted and len(outs) == len(schema.returns):
            return candidate, tuple(a.name for a in outs)
    return None, None


def out_overload(func) -> Optional[torch._ops.OpOverload]:
    return _out_overload_and_names(func)[0]


def out_argument_names(func) -> Optional[Tuple[str, ...]]:
    return _out_overload_and_names(func)[1]
