"""Which side of the bus a tensor is on, where device memory is host memory.

On the CPU backend a CUDA tensor and a host tensor are the same kind of tensor, so torch's own
move between them returns its input: an alias where CUDA makes a copy. CUDA programs rely on
that copy (a best-weights snapshot taken with ``.cpu()``, a pinned staging buffer refilled after
``.to("cuda", non_blocking=True)``, an array edited after ``.cpu().numpy()``). ``Residency``
remembers the side of each tensor a move placed, and knows as on the device every tensor whose
storage the device-memory count holds (``cudashim.device_memory``: what moves and constructors
put there, and views of it); a move returns its input only where the tensor is known to be at
the destination already, and any other move is a copy.

The copy is a clone, made at the move as CUDA makes its copy there. (A lazy copy, shared until
either side writes, would save the memcpy where neither does; but a lazily shared storage that
two threads write to at once, as a collective library's worker and the program do, breaks torch's
copy-on-write bookkeeping, and CUDA programs hand their tensors to such threads all the time.)

Where a tensor's side is not known (the result of an op, a tensor loaded from a file), a move
is a copy in either direction: data are never aliased where CUDA copies, and an alias is lost
only where a program moves an unplaced tensor to where it already is, which then costs a memcpy
CUDA does not pay (a move by a device read off a tensor, ``t.to(x.device)``, is not one: it
keeps torch's answer). A tensor a constructor makes on the device of memory torch does not own (``torch.as_tensor``
or ``torch.asarray`` of an array, a buffer) is a copy too, as CUDA copies it to its device; so
is ``numpy(force=True)`` of a tensor not known to be on the host, which CUDA moves there first.
A storage's move (``storage.cuda()``, ``.cpu()``) copies as a tensor's does. An optimizer's
loaded state is copied to the device for a parameter there, as CUDA's ``load_state_dict``
moves it (torch moves it by the parameter's device, here the host's).

A module's move is the other way round: its parameters and buffers of unknown side
stay, and are placed where the module went. A module moves itself in place, so nothing of
the program's still points to the memory it leaves, while views into a framework's flattened
buffer, buffers a program also holds, and tied weights must stay what they were.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from typing import Optional

import torch

DEVICE, HOST, PINNED = "device", "host", "pinned host"
_HOST_SIDES = (HOST, PINNED)
# What torch makes a tensor of in memory of its own: nothing of the program's is shared.
_PYTHON_VALUES = (list, tuple, int, float, complex, bool)


def plain_dense(tensor) -> bool:
    """Tensors whose move torch makes itself: plain and strided (not a subclass that moves
    itself, not sparse or nested)."""
    return (tensor.__class__ is torch.Tensor or tensor.__class__ is torch.nn.Parameter) \
        and tensor.layout is torch.strided


def _viewing(storage):
    """A tensor over ``storage``: how the device-memory count, which counts tensors' storages,
    is asked about a storage."""
    return torch.empty(0, dtype=torch.uint8).set_(storage)


class _ThreadMoves(threading.local):
    """Per thread: whether a module's move is under way, and whether moves keep torch's answer
    (``Residency.in_place``). Class defaults, because reading a thread-local attribute the thread
    never set raises and catches AttributeError (1 us, on every copying move)."""
    moving_module = False
    in_place = False


class Residency:
    """The side of every tensor a move placed, and the moves that honour it.

    Keyed by the tensor object (``id`` with a weak reference that forgets it when the tensor
    dies), so marking costs nothing until a move and a lookup is one dict probe.
    """

    def __init__(self, count=None, memory=None):
        # id(tensor) -> (side, weak reference); the compiled moves (``cudashim._speedups.Stay``)
        # probe it directly
        self.sides: dict = {}
        self.memory = memory             # a DeviceMemory that counts what is placed on the device
        self._count = count
        self._local = _ThreadMoves()
        self._compiling = torch.compiler.is_compiling
        self._tracing = torch.jit.is_tracing

    # --- sides ---------------------------------------------------------------------------
    def side_of(self, tensor) -> Optional[str]:
        """Where a move placed ``tensor``; else the device where its storage is device memory
        (a parameter made around a constructor's tensor, a view of a device tensor); else None."""
        entry = self.sides.get(id(tensor))
        if entry is not None:
            return entry[0]
        if self.memory is not None and self.memory.holds(tensor):
            return DEVICE
        return None

    def place(self, tensor, side: str):
        key, sides = id(tensor), self.sides

        def forget(reference, key=key):
            entry = sides.get(key)
            if entry is not None and entry[1] is reference:
                del sides[key]

        try:
            sides[key] = (side, weakref.ref(tensor, forget))
        except TypeError:
            return tensor
        if side is DEVICE and self.memory is not None:
            self.memory.add(tensor)
        return tensor

    def is_host(self, tensor) -> bool:
        return self.side_of(tensor) in _HOST_SIDES

    # --- moves ---------------------------------------------------------------------------
    def copy(self, tensor, side: str, api: str = "a move"):
        """A copy of ``tensor`` of its own, placed on ``side``."""
        result = tensor.clone()
        if self._count is not None:
            self._count(f"{api}, a copy", f"a copy to the {side}, as on CUDA")
        return self.place(result, side)

    def copying(self, api: str) -> tuple:
        """What a compiled move (``cudashim._speedups.Stay``) needs to make ``copy``'s copies
        itself: the device memory, the per-thread module moves, the dense layout, and the
        report's count for ``api`` (None where nothing is reported)."""
        count = self._count
        counted = None if count is None else \
            (lambda side: count(f"{api}, a copy", f"a copy to the {side}, as on CUDA"))
        return (self.memory, self._local, torch.strided, counted)

    def moved(self, tensor, result, side: Optional[str], api: str = "a move"):
        """What a move of ``tensor`` to ``side`` returns, given torch's own ``result`` (the
        tensor itself where it stays in host memory). ``side`` None: the destination is not
        known (a device object read off a tensor), so torch's answer stands."""
        if side is None or self._local.in_place:
            return result
        if result is not tensor:          # torch converted or copied: place what it made
            if result.__class__ is torch.Tensor:
                self.place(result, side)
            return result
        entry = self.sides.get(id(tensor))
        known = entry[0] if entry is not None else None
        if known == side or (side == HOST and known == PINNED):
            return tensor
        if self._compiling() or self._tracing():
            return result                 # a graph being recorded moves as torch's own code does
        if known is None:
            # a device tensor's storage under another object (``side_of``, less the probe above)
            if self.memory is not None and self.memory.holds(tensor):
                if side == DEVICE:
                    return tensor
            elif self._local.moving_module:
                return tensor             # a module's own tensor of unknown side stays (above)
        if not plain_dense(tensor):
            return result
        return self.copy(tensor, side, api)

    def adopted(self, data, result, side: Optional[str], api: str):
        """What a constructor that may share the memory of ``data`` (not a tensor: an array, a
        buffer, a DLPack capsule) returns for ``side``, given torch's ``result``. On CUDA such
        memory is the host's, so a tensor made of it on the device is a copy: here too, unless
        torch made the memory itself (from Python values) or it is device memory already."""
        if side != DEVICE or isinstance(data, _PYTHON_VALUES) or not plain_dense(result):
            return result
        if self.memory is not None and self.memory.holds(result):
            return result
        if self._compiling() or self._tracing():
            return result
        return self.copy(result, side, api)

    def storage_moved(self, storage, result, side: Optional[str], api: str):
        """What a storage's move (``UntypedStorage.cuda()``, ``.cpu()``, ``.to(device=)``, and
        the typed storages' through them) returns: as a tensor's move, the storage itself where it
        is known to be at the destination (device memory counted, or a copy this placed), else
        a copy of its own."""
        if side is None or result is not storage or self._local.in_place:
            return result
        known = self.sides.get(id(storage))
        if known is not None and known[0] == side:
            return storage
        on_device = self.memory is not None and self.memory.holds(_viewing(storage))
        if (on_device and side == DEVICE) or self._compiling() or self._tracing():
            return storage
        copy = storage.clone()
        if self._count is not None:
            self._count(f"{api}, a copy", f"a copy to the {side}, as on CUDA")
        if side == DEVICE and self.memory is not None:
            self.memory.add(_viewing(copy))
        else:
            self.place(copy, side)
        return copy

    def loaded_optimizer_state(self, optimizer, state_dict) -> None:
        """After ``Optimizer.load_state_dict``: torch moved each state tensor to its parameter's
        device by a device read off the parameter, which here is the host's, so a parameter on the
        device kept the loaded dict's own host tensor. CUDA copies it there; so does this, where
        CUDA would (not a step counter kept on the host, not a tensor already on the device)."""
        given = {id(value) for state in state_dict.get("state", {}).values() if isinstance(state, dict)
                 for value in state.values() if isinstance(value, torch.Tensor)}
        if not given:
            return
        for group in optimizer.param_groups:
            steps_move = bool(group.get("capturable") or group.get("fused"))
            for parameter in group["params"]:
                state = optimizer.state.get(parameter)
                if not state or self.side_of(parameter) != DEVICE:
                    continue
                for key, value in list(state.items()):
                    if id(value) not in given or (key == "step" and not steps_move) \
                            or self.side_of(value) == DEVICE or not plain_dense(value):
                        continue
                    state[key] = self.copy(value, DEVICE, "Optimizer.load_state_dict")

    def forced_to_host(self, tensor):
        """What ``numpy(force=True)`` reads of ``tensor``: on CUDA it moves a device tensor to the
        host first, so a tensor not known to be on the host is copied (as a move of unknown side
        is); a host tensor is itself, whose memory the array shares."""
        if self.is_host(tensor) or not plain_dense(tensor) or self._compiling() or self._tracing():
            return tensor
        return self.copy(tensor.detach(), HOST, "Tensor.numpy(force=True)")

    @contextlib.contextmanager
    def in_place(self):
        """Moves on this thread keep torch's answer, which is the tensor or storage itself: for
        cudashim's own code that takes device memory to the host to work on it by address and
        back (Triton's interpreter copies each argument's whole storage to the host and back at
        every launch). Device memory is host memory, so the work is done in place, as CUDA's
        kernel does it, without a copy the size of a KV cache at each launch."""
        outer = self._local.in_place
        self._local.in_place = True
        try:
            yield
        finally:
            self._local.in_place = outer

    # --- modules -------------------------------------------------------------------------
    @property
    def moving_module(self) -> bool:
        return self._local.moving_module

    @contextlib.contextmanager
    def module_move(self, module, side: str):
        """Around ``Module.to``/``cuda``/``cpu``: parameters keep their objects (torch swaps
        their ``.data``), so each is placed on ``side`` afterwards."""
        outer = self.moving_module
        self._local.moving_module = True
        try:
            yield
        finally:
            self._local.moving_module = outer
        for tensor in module.parameters():
            self.place(tensor, side)
        for tensor in module.buffers():
            self.place(tensor, side)
