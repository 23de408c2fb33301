"""Sparse compressed tensors (CSR, CSC, BSR, BSC) on a target without kernels for them: their
parts on the device, their ops computed on the host.

Unlike a COO tensor (``host_layouts``), a compressed tensor can be made on any device: torch
keeps it in a tensor of its own type (``SparseCsrTensorImpl``) whose parts, the compressed
indices, the plain indices and the values, are dense tensors of that device. ``x.to_sparse_csr()
.cuda()``, ``torch.sparse_csr_tensor(..., device="cuda")`` and a checkpoint's CSR tensor all
arrive there; what a target lacks is every kernel on its ``SparseCsr`` dispatch key, down to
``crow_indices()``. So:

- the ops that only read or write the tensor's parts (``tables.compressed_layouts.ON_THE_DEVICE``)
  run torch's own host kernel for them, which touches no data, on the device tensor;
- every other op is computed by torch's host kernel on a host copy made from the parts, as a
  kernel gap is served: arguments the op writes get the result back, compressed results are
  made again from their parts moved to the device, and dense ones are moved there.
"""

from __future__ import annotations

from typing import Callable, Optional

import torch
from torch.utils._pytree import tree_map

_real_device = torch._C.device     # torch.device may be patched: compare with the real class
COMPRESSED = (torch.sparse_csr, torch.sparse_csc, torch.sparse_bsr, torch.sparse_bsc)
# torch's host kernels for the compressed layouts, called on device tensors for the ops that
# touch no data: they read the tensor's parts, which are the device's own tensors.
_HOST_KERNELS = torch._C.DispatchKeySet(torch._C.DispatchKey.SparseCsrCPU)


def is_compressed(value) -> bool:
    return isinstance(value, torch.Tensor) and value.layout in COMPRESSED


def parts(tensor: torch.Tensor):
    """(compressed indices, plain indices, values) of a compressed tensor on any device."""
    row_major = tensor.layout in (torch.sparse_csr, torch.sparse_bsr)
    compressed = torch.ops.aten.crow_indices if row_major else torch.ops.aten.ccol_indices
    plain = torch.ops.aten.col_indices if row_major else torch.ops.aten.row_indices
    return tuple(op.default.redispatch(_HOST_KERNELS, tensor)
                 for op in (compressed, plain, torch.ops.aten.values))


def made_from(tensor: torch.Tensor, device) -> torch.Tensor:
    """``tensor`` (compressed) made again on ``device`` from its parts moved there."""
    moved = [part.to(device) for part in parts(tensor)]
    return torch.ops.aten._sparse_compressed_tensor_unsafe.default(
        *moved, list(tensor.size()), dtype=tensor.dtype, layout=tensor.layout, device=device)


def reduced(tensor: torch.Tensor):
    """What torch pickles for a compressed CUDA tensor: its layout, parts and size."""
    return torch._utils._rebuild_sparse_tensor, (tensor.layout, (*parts(tensor), tensor.size()))


def on_the_device_kernel(overload):
    """The op run by torch's host kernel on the device tensor itself (it touches no data)."""
    def kernel(*args, **kwargs):
        return overload.redispatch(_HOST_KERNELS, *args, **kwargs)
    kernel.__name__ = f"parts_of_{overload.name().replace('::', '_')}"
    return kernel


def host_kernel(overload, device_type: str,
                observe: Optional[Callable[[str, torch.layout], None]] = None):
    """The op computed by torch's host kernel on host copies of its device arguments."""
    def kernel(*args, **kwargs):
        if observe is not None:
            observe(overload.name(), _first_layout(args, kwargs))
        return on_host(overload, device_type, args, kwargs)
    kernel.__name__ = f"host_computed_{overload.name().replace('::', '_')}"
    return kernel


def on_host(func, device_type: str, args, kwargs):
    device = None
    originals = {}           # id(host copy) -> the program's device tensor it stands for

    def to_host(value):
        nonlocal device
        if isinstance(value, torch.Tensor) and value.device.type == device_type:
            device = device or value.device
            host = made_from(value, "cpu") if is_compressed(value) else value.cpu()
            originals[id(host)] = value
            return host
        if isinstance(value, _real_device) and value.type == device_type:
            device = device or value
            return torch.device("cpu")
        return value

    host_args, host_kwargs = tree_map(to_host, args), tree_map(to_host, kwargs)
    result = func(*host_args, **host_kwargs)
    if device is None:
        return result
    if device.index is None:
        device = torch.device(device_type, torch.get_device_module(device_type).current_device())
    for host, original in written_arguments(func, host_args, host_kwargs, originals):
        write_back(original, host)
    return tree_map(lambda value: returned(value, device, originals), result)


def returned(value, device, originals, hold=None):
    """A host kernel's result where CUDA would have returned it: the program's own tensor for
    an argument the op wrote (an in-place op's self, ``out=``), a compressed tensor made again
    on the device from its parts, any other sparse one held by ``hold`` where given, the rest
    moved to the device."""
    if not isinstance(value, torch.Tensor):
        return value
    original = originals.get(id(value))
    if original is not None:
        return original
    if is_compressed(value):
        return made_from(value, device)
    if value.layout is torch.strided or hold is None:
        return value.to(device)
    return hold(value, device)


def write_back(device_tensor: torch.Tensor, host: torch.Tensor) -> None:
    """What the host kernel wrote into ``host``, written into the device tensor it stood for:
    a compressed tensor's parts resized to the host result's (its number of elements may have
    changed) and copied."""
    if not is_compressed(device_tensor):
        device_tensor.copy_(host)
        return
    written = made_from(host, device_tensor.device)
    if any(mine.shape != theirs.shape for mine, theirs in zip(parts(device_tensor), parts(written))):
        torch.ops.aten.resize_as_sparse_.default.redispatch(_HOST_KERNELS, device_tensor, written)
    for mine, theirs in zip(parts(device_tensor), parts(written)):
        mine.copy_(theirs)


def written_arguments(func, host_args, host_kwargs, originals):
    """(host copy, device tensor) of every argument the op writes (``mul_``'s self, ``out=``)."""
    for position, argument in enumerate(func._schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        if argument.kwarg_only or position >= len(host_args):
            written = host_kwargs.get(argument.name)
        else:
            written = host_args[position]
        for host in (written if isinstance(written, (list, tuple)) else (written,)):
            original = originals.get(id(host)) if isinstance(host, torch.Tensor) else None
            if original is not None:
                yield host, original


def _first_layout(args, kwargs):
    for value in (*args, *kwargs.values()):
        if is_compressed(value):
            return value.layout
    return None
