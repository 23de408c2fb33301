"""The record of a capture: every op that ran on the target, and what it read and wrote.

The recorder is a dispatch mode, so it sees ops below autograd and autocast, as the kernels
see them, in the order they run (a backward that autograd's engine runs on a device thread
included: the engine carries the mode there). Work that touches only host memory is left out,
as CUDA leaves host work out of a graph; on the CPU backend the host is the target, so all of
it is recorded.

Capture rules that matter for correctness are kept: a host sync on captured work (``.item()``,
an op whose output shape depends on values, a blocking copy to the host) raises CUDA's error,
so a program that is wrong on CUDA is not silently right here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from typing import Callable, Dict, List, Optional, Tuple

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from ..errors import refusal

aten = torch.ops.aten

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"

# Ops whose output shape depends on values: each reads its input on the host. With the
# argument that fixes the shape given, they stay on the device (``output_size=``,
# ``num_classes=``), and ``index`` syncs only for boolean masks.
_SHAPE_GIVEN_BY = {aten.repeat_interleave.Tensor: "output_size", aten.one_hot.default: "num_classes"}


@dataclasses.dataclass
class Step:
    """One recorded op: what ran, on what, and which of its outputs are new memory."""
    func: torch._ops.OpOverload
    args: tuple
    kwargs: dict
    outputs: Tuple[torch.Tensor, ...]         # every tensor it returned, flattened
    fresh: Tuple[bool, ...]                   # per output: new memory, not a view of an input
    writes: bool                              # it writes into an argument (in place, out=)


def storage_key(tensor: torch.Tensor) -> Optional[int]:
    """Where a tensor's memory is (None for tensors without a storage, and for empty ones)."""
    try:
        return tensor.untyped_storage().data_ptr() or None
    except (RuntimeError, NotImplementedError):
        return None


def written_arguments(func, args, kwargs) -> List[torch.Tensor]:
    """The tensors ``func`` writes into, by its schema (``Tensor(a!)``)."""
    written = []
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = args[position] if position < len(args) else kwargs.get(argument.name)
        written.extend(t for t in pytree.tree_leaves(value) if isinstance(t, torch.Tensor))
    return written


_METADATA_TAGS = tuple(tag for tag in (getattr(torch.Tag, "inplace_view", None),
                                        getattr(torch.Tag, "nondeterministic_seeded", None)) if tag is not None)


@functools.lru_cache(maxsize=None)
def _in_place_on_values(func) -> bool:
    """An in-place op (``add_``, ``index_copy_``, ``_foreach_mul_``): it writes its first argument,
    nothing else (no ``out=``), and returns only what it wrote; not one that changes a tensor's
    sizes or storage (``inplace_view``) or draws from a generator."""
    schema = func._schema
    if not schema.arguments or any(tag in func.tags for tag in _METADATA_TAGS):
        return False
    first, *others = schema.arguments
    if first.alias_info is None or not first.alias_info.is_write \
            or any(a.alias_info is not None and a.alias_info.is_write for a in others):
        return False
    return all(r.alias_info is not None and r.alias_info.is_write
               and r.alias_info.before_set == first.alias_info.before_set for r in schema.returns)


def _returned_unrun(func, args, kwargs):
    """What an in-place op returns without being run (``_in_place_on_values``): its first
    argument, once per return."""
    first = args[0] if args else kwargs[func._schema.arguments[0].name]
    returns = len(func._schema.returns)
    return None if returns == 0 else first if returns == 1 else (first,) * returns


class OpaqueWork:
    """Work the dispatcher does not see whole, recorded as one step: ``run()`` does it again."""

    def __init__(self, name: str, run: Callable[[], None]):
        self.name = name
        self.run = run

    def __call__(self) -> None:
        self.run()

    def __str__(self) -> str:
        return self.name


class Recorder(TorchDispatchMode):
    """Records the ops of one capture on ``target_type``'s devices."""

    def __init__(self, target_type: str):
        super().__init__()
        self.target_type = target_type
        self._opaque = 0                          # depth of unrecorded work running (``unrecorded``)
        self.steps: List[Step] = []
        self.error: Optional[str] = None          # the capture rule a program broke
        self._made: set = set()                   # memory the capture allocated
        self._written: set = set()                # memory the capture wrote
        # Tensors from before the capture that it wrote, with their values before the first
        # write, restored when the capture ends; and the generators it drew from.
        self._saved: Dict[tuple, Tuple[torch.Tensor, torch.Tensor]] = {}
        self._generators: Dict[int, tuple] = {}       # id -> (generator, its state)

    # --- the mode ---------------------------------------------------------------------
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._opaque:
            return func(*args, **kwargs)
        leaves = pytree.tree_leaves((args, kwargs))
        tensors = [leaf for leaf in leaves if isinstance(leaf, torch.Tensor)]
        if not self._on_target(tensors, kwargs):
            return func(*args, **kwargs)
        self._refuse_host_sync(func, args, kwargs, tensors)
        written = written_arguments(func, args, kwargs)
        if written and self._left_to_the_replays(func, args, kwargs, written):
            self._written.update(storage_key(t) for t in written)
            self.steps.append(Step(func, args, kwargs, tuple(written), (False,) * len(written), True))
            return _returned_unrun(func, args, kwargs)
        for tensor in written:
            self._save_before_first_write(tensor)
        for leaf in leaves:
            if isinstance(leaf, torch._C.Generator) and id(leaf) not in self._generators:
                self._generators[id(leaf)] = (leaf, leaf.get_state())
        result = func(*args, **kwargs)
        outputs = tuple(t for t in pytree.tree_leaves(result) if isinstance(t, torch.Tensor))
        read = {storage_key(t) for t in tensors}
        fresh = tuple(storage_key(t) is not None and storage_key(t) not in read for t in outputs)
        self._made.update(storage_key(t) for t, new in zip(outputs, fresh) if new)
        self._written.update(storage_key(t) for t in written)
        self.steps.append(Step(func, args, kwargs, outputs, fresh, bool(written)))
        return result

    def _left_to_the_replays(self, func, args, kwargs, written) -> bool:
        """Whether an op writing into memory from before the capture is recorded without being
        run now, as CUDA's capture runs nothing. Run, it would mean saving what it writes to
        give it back when the capture ends: a whole KV cache, for an inference engine's
        ``index_copy_`` or ``index_put_`` of a token's keys into it. Left are the in-place ops
        on plain dense tensors whose only effect is on their values (not a view's shape,
        ``unsqueeze_``, ``set_``; not a generator's state) and whose sizes torch's meta kernels
        accept: an op that would fail runs now and fails as it would on CUDA."""
        if not _in_place_on_values(func) \
                or all(storage_key(tensor) in self._made for tensor in written) \
                or any(tensor.__class__ is not torch.Tensor and tensor.__class__ is not torch.nn.Parameter
                       or tensor.layout is not torch.strided for tensor in written):
            return False
        def on_meta(value):
            if isinstance(value, torch.Tensor):
                return torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
            return value
        try:
            meta_args, meta_kwargs = pytree.tree_map(on_meta, (args, kwargs))
            func(*meta_args, **meta_kwargs)
        except Exception:         # no meta kernel, or an error the op raises when run
            return False
        return True

    def record_opaque(self, work: OpaqueWork, tensors) -> None:
        """Record ``work`` as one step a replay runs again: a Triton kernel run through its
        interpreter reads and writes memory by address, which no op shows. It is not run now,
        as CUDA's capture runs nothing: running it would mean saving every tensor it may write
        (its arguments, ``tensors``) to give their values back when the capture ends, and an
        inference engine hands its kernels views of a whole KV cache. Those on the target count
        as written by the capture, so reading one on the host afterwards waits for captured work."""
        self._written.update(storage_key(tensor) for tensor in tensors if self._on_target([tensor], {}))
        self.steps.append(Step(work, (), {}, (), (), True))

    @contextlib.contextmanager
    def unrecorded(self):
        """Ops run here are not the capture's: a step's own work, or cudashim's probes."""
        self._opaque += 1
        try:
            yield
        finally:
            self._opaque -= 1

    def _on_target(self, tensors, kwargs) -> bool:
        if self.target_type == "cpu":
            return True
        device = kwargs.get("device")
        if device is not None and torch.device(device).type == self.target_type:
            return True
        return any(t.device.type == self.target_type for t in tensors)

    # --- capture rules ------------------------------------------------------------------
    def _refuse_host_sync(self, func, args, kwargs, tensors) -> None:
        reason = self._host_sync(func, args, kwargs)
        if reason is None or not any(self._holds_captured_work(t) for t in tensors):
            return
        self.error = f"{NOT_PERMITTED} ({func}: {reason})"
        error = getattr(torch, "AcceleratorError", RuntimeError)     # CUDA's, since torch 2.8
        raise refusal(error(f"{self.error}. Do this before or after the capture, as CUDA requires."))

    def _host_sync(self, func, args, kwargs) -> Optional[str]:
        """Why ``func`` waits for the device on the host, or None."""
        if torch.Tag.data_dependent_output in func.tags:
            return "it reads a tensor's value on the host"
        if torch.Tag.dynamic_output_shape in func.tags:
            if func is aten.index.Tensor:
                masks = [i for i in (args[1] if len(args) > 1 else ()) if isinstance(i, torch.Tensor)
                         and i.dtype in (torch.bool, torch.uint8)]
                return "a boolean mask's size is read on the host" if masks else None
            given = _SHAPE_GIVEN_BY.get(func)
            if given is not None and kwargs.get(given) not in (None, -1):
                return None
            return "its output's size depends on the values, read on the host"
        if self.target_type != "cpu" and func in (aten._to_copy.default, aten.copy_.default):
            destination = (args[0] if func is aten.copy_.default else None)
            to_host = (destination.device.type == "cpu" if destination is not None
                       else torch.device(kwargs.get("device") or "cpu").type == "cpu")
            blocking = not (args[2] if len(args) > 2 else kwargs.get("non_blocking", False))
            if to_host and blocking:
                return "a blocking copy to the host waits for the device"
        return None

    def _holds_captured_work(self, tensor: torch.Tensor) -> bool:
        """Whether reading ``tensor`` on the host reads work the capture recorded. On a
        device, any of its tensors; on the CPU backend, where the host is the device, those
        the capture made or wrote."""
        if self.target_type != "cpu":
            return tensor.device.type == self.target_type
        key = storage_key(tensor)
        return key is not None and (key in self._made or key in self._written)

    # --- undoing what CUDA would not have done --------------------------------------------
    def _save_before_first_write(self, tensor: torch.Tensor) -> None:
        key = storage_key(tensor)
        if key is None or key in self._made:
            return
        view = (key, tensor.storage_offset(), tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype)
        if view not in self._saved:
            self._saved[view] = (tensor, tensor.clone())

    def undo(self, generator_states) -> None:
        """Give back the values the capture overwrote, newest write last undone, and the
        generators their states (``generator_states``: the default ones, from the backend)."""
        with torch.no_grad():
            for tensor, before in reversed(list(self._saved.values())):
                tensor.copy_(before)
        self._saved.clear()
        for generator, state in self._generators.values():
            generator.set_state(state)
        self._generators.clear()
        generator_states.restore()
