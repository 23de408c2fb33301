"""``torch.cuda.comm`` on the target: broadcast, scatter, gather and reduce by CUDA index.

Each function keeps torch.cuda.comm's signature, results and errors. What CUDA hands back
without a copy it hands back here too: ``broadcast`` the tensor itself on the device it is
on, ``broadcast_coalesced`` the inputs themselves for ``devices[0]``, ``scatter`` a view for
the chunk that stays on its device. Any other result is a tensor of its own, also where two
CUDA indices share one real device. Copies run on the current stream: a caller that then
waits on the streams it passed waits on work already ordered before its own.
"""

from __future__ import annotations

import warnings
from typing import List, Optional, Sequence

import torch
from torch._utils import (_flatten_dense_tensors, _handle_complex, _reorder_tensors_as,
                          _take_tensors, _unflatten_dense_tensors)

HOST = -1                      # torch.cuda.comm's index for host memory
_real_to = torch._C.TensorBase.to      # not the patched Tensor.to: the device here is already real
_real_device = torch._C.device


class DeviceComm:
    """The collectives of one process over the target's devices, addressed by CUDA index."""

    def __init__(self, backend, translate):
        self.backend = backend
        self.translate = translate       # CUDA index -> the target device (checks the ordinal)
        self.host = _real_device("cpu")

    # --- devices ----------------------------------------------------------------------
    def index(self, device, *, optional: bool = False, allow_cpu: bool = False) -> int:
        """The CUDA index a device argument names, by torch's ``_get_device_index`` rules.
        A spec string is parsed as written ("cuda:1" names index 1 also where every CUDA
        index is the host)."""
        if device is None:
            if optional:
                return self.backend.current_device()
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        if isinstance(device, int) and not isinstance(device, bool):
            return device
        parsed = _real_device(device) if isinstance(device, str) else device
        if not isinstance(parsed, _real_device):
            raise ValueError(f"Expected a torch.device with a specified index or an integer, but got:{device}")
        if parsed.type == "cpu" and self.backend.device_type != "cpu":
            if allow_cpu:
                return HOST
            raise ValueError(f"Expected a non cpu device, but got: {parsed}")
        if parsed.type not in ("cuda", self.backend.device_type):
            raise ValueError(f"Expected a cuda device, but got: {parsed}")
        return self.backend.current_device() if parsed.index is None else parsed.index

    def device(self, index: int) -> "torch.device":
        return self.host if index == HOST else self.translate(index)

    def index_of(self, tensor) -> int:
        """The CUDA index of the device ``tensor`` is on, as ``get_device()`` tells the program;
        HOST for host memory where the target is a device."""
        if tensor.device.type != self.backend.device_type:
            return HOST
        if self.backend.shares_devices:          # the program's current device stands for it
            return self.backend.current_device()
        return tensor.device.index

    def move(self, tensor, index: int, source: int):
        """``tensor`` on CUDA device ``index``: itself where ``source`` is that device, else a
        copy of its own (on a shared real device too)."""
        if index == source:
            return tensor
        return _real_to(tensor, self.device(index), copy=True)

    # --- torch.cuda.comm ----------------------------------------------------------------
    def broadcast(self, tensor, devices=None, *, out=None):
        """Copies of ``tensor`` on ``devices``, or into ``out``."""
        tensor = _handle_complex(tensor)
        if not ((devices is None) ^ (out is None)):
            raise RuntimeError(f"Exactly one of 'devices' and 'out' must be specified, but got "
                               f"devices={devices} and out={out}")
        if devices is not None:
            source = self.index_of(tensor)
            return tuple(self.move(tensor, self.index(d), source) for d in devices)
        for i, target in enumerate(out):
            if target.shape != tensor.shape:
                raise RuntimeError(f"Expected all output tensors to have same shape as the source "
                                   f"(shape {tuple(tensor.shape)}), but output tensor at index {i} "
                                   f"has shape {tuple(target.shape)}")
            target.copy_(tensor)
        return tuple(out)

    def broadcast_coalesced(self, tensors, devices, buffer_size: int = 10485760) -> List[list]:
        """[tensors on devices[0] (the inputs themselves), copies on devices[1], ...]; small
        tensors travel together in buffers of at most ``buffer_size`` bytes."""
        indices = [self.index(d) for d in devices]
        if not indices:
            raise RuntimeError("Expected at least one device to broadcast to")
        tensors = [_handle_complex(t) for t in tensors]
        source = self.device(indices[0])
        for t in tensors:
            if t.device != source:
                raise RuntimeError(f"All tensors must be on devices[0]: {indices[0]}, but got "
                                   f"{self.index_of(t)}")
        return [list(tensors)] + [self._coalesced_copy(tensors, index, buffer_size)
                                  for index in indices[1:]]

    def _coalesced_copy(self, tensors, index: int, buffer_size: int) -> list:
        target, copies = self.device(index), []
        for chunk in _take_tensors(tensors, buffer_size):
            if chunk[0].is_sparse:
                copies.extend(_real_to(t, target, copy=True) for t in chunk)
                continue
            flat = _real_to(_flatten_dense_tensors(chunk), target, copy=True)
            copies.extend(_unflatten_dense_tensors(flat, chunk))
        return list(_reorder_tensors_as(copies, tensors))

    def reduce_add(self, inputs, destination: Optional[int] = None):
        """The sum of ``inputs`` (one per device) on ``destination``, which must hold one of them."""
        index = self.index(destination, optional=True)
        target = self.device(index)
        size, root = inputs[0].size(), None
        for i, tensor in enumerate(inputs):
            if tensor.device.type == "cpu" and self.backend.device_type != "cpu":
                raise AssertionError(f"reduce_add expects all inputs to be on GPUs, but input {i} is on CPU")
            if root is None and tensor.device == target:
                root = i
            if tensor.size() != size:
                got, expected = ("x".join(map(str, s)) for s in (tensor.size(), size))
                raise ValueError(f"input {i} has invalid size: got {got}, but expected {expected}")
        if root is None:
            raise RuntimeError("reduce_add expects destination to be on the same GPU with one of the tensors")
        if len(inputs) == 1:
            return inputs[0]
        result = inputs[root].clone()
        for i, tensor in enumerate(inputs):
            if i != root:
                result.add_(_real_to(tensor, target))
        return result

    def reduce_add_coalesced(self, inputs, destination: Optional[int] = None, buffer_size: int = 10485760):
        """``reduce_add`` of each tensor position across ``inputs`` (one sequence per device),
        dense tensors summed in flattened buffers."""
        dense: List[list] = [[] for _ in inputs]
        output, order = [], []
        for same_tensor in zip(*inputs):
            if all(t.is_sparse for t in same_tensor):
                output.append(self.reduce_add(same_tensor, destination))
                order.append(same_tensor[0])
                continue
            for on_device, t in zip(dense, same_tensor):
                on_device.append(t.to_dense() if t.is_sparse else t)
            order.append(dense[0][-1])
        for chunks in zip(*(_take_tensors(d, buffer_size) for d in dense)):
            total = self.reduce_add([_flatten_dense_tensors(c) for c in chunks], destination)
            output.extend(t.data for t in _unflatten_dense_tensors(total, chunks[0]))
        return tuple(_reorder_tensors_as(output, order))

    def scatter(self, tensor, devices=None, chunk_sizes: Optional[Sequence[int]] = None, dim: int = 0,
                streams=None, *, out=None):
        """``tensor`` split along ``dim`` over ``devices`` (equal chunks, or ``chunk_sizes``),
        or into ``out``."""
        tensor = _handle_complex(tensor)
        if out is not None:
            if devices is not None:
                raise RuntimeError(f"'devices' must not be specified when 'out' is specified, but "
                                   f"got devices={devices}")
            if chunk_sizes is not None:
                raise RuntimeError(f"'chunk_sizes' must not be specified when 'out' is specified, "
                                   f"but got chunk_sizes={chunk_sizes}")
            for target, chunk in zip(out, tensor.split([t.size(dim) for t in out], dim)):
                target.copy_(chunk)
            return tuple(out)
        indices = [self.index(d) for d in devices]
        if chunk_sizes is None:
            chunks = tensor.chunk(len(indices), dim)
        else:
            if len(chunk_sizes) != len(indices):
                raise RuntimeError(f"Expected devices and chunk_sizes to be of same length, but got "
                                   f"len(devices) = {len(indices)} and len(chunk_sizes) = {len(chunk_sizes)}")
            chunks = tensor.split(list(chunk_sizes), dim)
        source = self.index_of(tensor)
        return tuple(self.move(chunk, index, source) for chunk, index in zip(chunks, indices))

    def gather(self, tensors, dim: int = 0, destination=None, *, out=None):
        """``tensors`` (one per device) concatenated along ``dim`` on ``destination`` (the
        current device by default, ``"cpu"`` or -1 for host memory), or into ``out``."""
        tensors = [_handle_complex(t) for t in tensors]
        if out is not None:
            if destination is not None:
                raise RuntimeError(f"'destination' must not be specified when 'out' is specified, "
                                   f"but got destination={destination}")
            return torch.cat([_real_to(t, out.device) for t in tensors], dim, out=out)
        if destination == -1:
            warnings.warn('Using -1 to represent CPU tensor is deprecated. Please use a device '
                          'object or string instead, e.g., "cpu".', FutureWarning, stacklevel=2)
        target = self.device(self.index(destination, optional=True, allow_cpu=True))
        return torch.cat([_real_to(t, target) for t in tensors], dim)

    def functions(self):
        """{torch.cuda.comm name: this process's implementation}."""
        return {name: getattr(self, name) for name in COMM_NAMES}


COMM_NAMES = ("broadcast", "broadcast_coalesced", "reduce_add", "reduce_add_coalesced",
              "scatter", "gather")
