"""Sparse tensors on a target without sparse kernels: held in host memory, behind a tensor of
the target's device.

On CUDA a sparse tensor lives on the device like any other: ``adjacency.cuda()`` in a graph
network, ``nn.Embedding(sparse=True)``'s gradients, ``x.to_sparse_csr()``. Many targets have
no kernels for the sparse layouts (the test accelerator, torchvulkan, several vendors'), so
such a tensor cannot even be made there: torch fails at its constructor (``Could not run
'aten::_sparse_coo_tensor_with_dims_and_tensors' with arguments from the 'Sparse<device>'
backend``).

``HostHeld`` is that tensor: its device is the target's and its layout the sparse one, and
it holds a host tensor with the data. Every op on it runs torch's host kernel, as a kernel
gap is served (``kernel_gaps``): device arguments are read to the host, arguments the op
writes are written back, a sparse result is held again and a strided result is moved to the
device, where CUDA would have returned it. The constructors that make sparse tensors on the
target's device (``on_host``) make a ``HostHeld`` the same way, so every path to a sparse
device tensor (a move, a constructor with ``device=``, a conversion, an autograd formula)
arrives at one.

A held tensor saves as the sparse tensor CUDA saves (``torch._utils._rebuild_sparse_tensor``
of its device indices and values), so a checkpoint needs no cudashim to load.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.utils._pytree import tree_map

from .host_compressed import returned, written_arguments

_real_device = torch._C.device     # torch.device may be patched: compare with the real class


def make_host_held(device_type: str, observe: Optional[Callable[[str, torch.layout], None]] = None):
    """The ``HostHeld`` class for a target: ``observe(op name, layout)`` is told of every op
    run on the host for a held tensor (the report's count, the warning)."""

    class HostHeld(torch.Tensor):
        """A sparse tensor of the target's device whose data are a host tensor (``host``)."""

        @staticmethod
        def __new__(cls, host: torch.Tensor, device: torch.device):
            held = torch.Tensor._make_wrapper_subclass(cls, host.size(), dtype=host.dtype,
                                                       layout=host.layout, device=device)
            held.host = host
            return held

        @classmethod
        def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
            if observe is not None:
                observe(func.name(), next(_held_layouts(args, kwargs, cls), None))
            return on_host(func, args, kwargs or {})

        def __reduce_ex__(self, protocol):
            # What torch saves for a sparse CUDA tensor: its layout and its device tensors.
            data = (self._indices(), self._values(), self.size(), self.is_coalesced())
            return torch._utils._rebuild_sparse_tensor, (self.layout, data)

        def __deepcopy__(self, memo):
            copied = HostHeld(self.host.clone(), self.device)
            memo[id(self)] = copied
            return copied

        def __repr__(self, *, tensor_contents=None):
            text = repr(self.host)
            return text[:-1] + f", device='{self.device}')" if text.endswith(")") else text

    def on_host(func, args, kwargs):
        """``func`` run by torch's host kernels: held tensors read as their host tensors,
        device tensors copied to the host, the target's device named as the host; written
        arguments copied back; results held (sparse) or moved to the device (strided)."""
        device = None
        to_the_host = False      # the op names the host (``held.cpu()``): its results stay there
        originals = {}           # id(host stand-in) -> the program's tensor it stands for

        def to_host(value):
            nonlocal device, to_the_host
            if isinstance(value, HostHeld):
                device = device or value.device
                originals[id(value.host)] = value
                return value.host
            if isinstance(value, torch.Tensor) and value.device.type == device_type:
                device = device or value.device
                host = value.cpu()
                originals[id(host)] = value
                return host
            if isinstance(value, _real_device) and value.type == device_type:
                device = device or value
                return torch.device("cpu")
            if isinstance(value, _real_device) and value.type == "cpu":
                to_the_host = True
            return value

        host_args, host_kwargs = tree_map(to_host, args), tree_map(to_host, kwargs)
        result = func(*host_args, **host_kwargs)
        if device is None:
            return result
        _write_back(func, host_args, host_kwargs, originals)
        if to_the_host:
            return result
        if device.index is None:
            device = torch.device(device_type, torch.get_device_module(device_type).current_device())
        return tree_map(lambda value: returned(value, device, originals, HostHeld), result)

    HostHeld.on_host = staticmethod(on_host)
    HostHeld.device_type = device_type
    return HostHeld


def _held_layouts(args, kwargs, cls):
    for value in (*args, *kwargs.values()):
        if isinstance(value, cls):
            yield value.layout


def _write_back(func, host_args, host_kwargs, originals) -> None:
    """Copy every argument the op wrote (``add_``'s self, ``out=``) to the device tensor the
    host copy stood for; a held tensor's host tensor was written itself."""
    for host, original in written_arguments(func, host_args, host_kwargs, originals):
        if original is not host and original.layout is torch.strided:
            original.copy_(host)
