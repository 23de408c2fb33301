"""Sparse tensors on a target without sparse kernels: made and computed on the host, held
behind a tensor of the target's device (``kernels/host_layouts.py``).

What reaches the target's keys and makes a sparse tensor there gets a kernel here, for the
layouts the target has none for (and only for ops it has no kernel of its own for):

- on its sparse key, COO's constructors: every move (``_to_copy`` calls them), constructor
  with ``device=`` and autograd formula (``nn.Embedding(sparse=True)``'s gradient) that makes
  a COO tensor on the device;
- on its dense key, the conversion of a device tensor (``to_sparse``).

Each makes a ``HostHeld``; ops on one run on the host from then on.

The compressed layouts (CSR, CSC, BSR, BSC) need no holding: torch makes them on any device,
from parts that are the device's own dense tensors (``kernels/host_compressed.py``). Every op
torch has a host kernel for on them (``tables/compressed_layouts.py``) gets a kernel on the
target's ``SparseCsr`` key, and the conversions to them one on its dense key: the ops that only
touch the tensor's parts run on the device, the rest on the host.

The first op of each kind of layout run on the host is named by one warning; the report counts
each.
"""

from __future__ import annotations

import functools
import inspect
import threading
from typing import Dict, List

import torch

from ..errors import warn_once
from ..kernels import host_compressed
from ..kernels.host_layouts import make_host_held
from ..tables import compressed_layouts
from .kernel_gaps import dispatch_key

COO_CONSTRUCTORS = ("_sparse_coo_tensor_with_dims_and_tensors", "_sparse_coo_tensor_with_dims")
CONVERSIONS = ("_to_sparse", "_to_sparse.sparse_dim")
COMPRESSED_CONVERSIONS = ("_to_sparse_csr", "_to_sparse_csc", "_to_sparse_bsr", "_to_sparse_bsc")


def missing_kernels(device_type: str) -> Dict[str, List[str]]:
    """{dispatch key: [ops]} this module registers for ``device_type``: empty where its keys
    have sparse kernels (the CPU, CUDA, XPU) or no sparse keys at all."""
    key = dispatch_key(device_type)
    if key is None or not hasattr(torch._C.DispatchKey, f"Sparse{key}"):
        return {}

    sparse_key = f"Sparse{key}"
    if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{COO_CONSTRUCTORS[0]}", sparse_key):
        return {}                        # the target's own sparse kernels

    known = set(torch._C._dispatch_get_all_op_names())

    def lacking(ops, on):
        return [op for op in ops if f"aten::{op.partition('.')[0]}" in known
                and not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", on)]

    missing = {sparse_key: lacking(COO_CONSTRUCTORS, sparse_key),
               key: lacking(CONVERSIONS + COMPRESSED_CONVERSIONS, key)}
    return {k: ops for k, ops in missing.items() if ops}


def missing_compressed_kernels(device_type: str) -> List[str]:
    """The ops on the compressed layouts torch has host kernels for and ``device_type``'s
    ``SparseCsr`` key has none for: empty where it has kernels of its own (the CPU, CUDA)."""
    key = dispatch_key(device_type)
    if key is None or not hasattr(torch._C.DispatchKey, f"SparseCsr{key}"):
        return []
    compressed_key = f"SparseCsr{key}"
    if torch._C._dispatch_has_kernel_for_dispatch_key("aten::crow_indices", compressed_key):
        return []                        # the target's own compressed kernels
    return [op for op in compressed_layouts.OPS
            if torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", "SparseCsrCPU")
            and not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{op}", compressed_key)]


def layouts_held(device_type: str) -> List[str]:
    """The layouts whose ops ``device_type`` runs on the host (for ``doctor --kernels``)."""
    missing = missing_kernels(device_type)
    held = ["sparse COO"] if any(k.startswith("Sparse") for k in missing) else []
    return held + (["CSR, CSC, BSR and BSC"] if missing_compressed_kernels(device_type) else [])


def lacks_nested_tensors(device_type: str) -> bool:
    """Whether ``device_type`` has a dispatch key of its own and no kernel there that makes a
    nested tensor (on CUDA, XPU and the CPU torch has them)."""
    key = dispatch_key(device_type)
    return key is not None and not torch._C._dispatch_has_kernel_for_dispatch_key(
        "aten::_nested_tensor_from_mask", key)


def install(activation):
    device_type = activation.backend.device_type
    if lacks_nested_tensors(device_type):
        _serve_nested_encoders(activation, device_type)
    missing = missing_kernels(device_type)
    compressed = missing_compressed_kernels(device_type)
    if not missing and not compressed:
        return
    count = activation.count if activation.reporting else None

    def observe(op, layout):
        name = f"aten::{op.partition('::')[2] or op}"
        if layout is torch.sparse_coo:
            warn_once(f"host-layout-{device_type}",
                      f"{layout} tensors on '{device_type}' are held in host memory, since it has no "
                      f"kernels for sparse layouts: {name} and every other op on them run on the host, "
                      f"and their results that are not sparse come back to the device (--report counts "
                      f"each op)")
        else:
            layout = layout or _conversion_layout(op)
            warn_once(f"host-compressed-{device_type}",
                      f"'{device_type}' has no kernels for sparse compressed tensors (CSR, CSC, BSR, "
                      f"BSC): {name} on {layout} and every other op on them run on the host, and "
                      f"their results come back to the device (--report counts each op)")
        if count is not None:
            # one row per layout: an op run on a COO tensor and on a CSR one are two rows
            count(name if layout is torch.sparse_coo else f"{name} on {layout}",
                  f"run on the host ({layout}, which '{device_type}' has no kernels for)")

    library = torch.library.Library("aten", "IMPL")
    activation.registry.add_undo(f"sparse tensors computed on the host for {device_type}", library._destroy)
    if missing:
        held = make_host_held(device_type, observe)
        for key, ops in missing.items():
            for op in ops:
                overload = _overload(op)
                kernel = (host_compressed.host_kernel(overload, device_type, observe)
                          if op in COMPRESSED_CONVERSIONS else _host_kernel(held, overload))
                library.impl(op, kernel, key)
    if compressed:
        _save_compressed_as_cuda_does(activation, device_type)
        for op in compressed_layouts.VALIDATIONS:
            if hasattr(torch.ops.aten, op):
                library.impl(op, host_compressed.host_kernel(_overload(op), device_type),
                             dispatch_key(device_type))
    compressed_key = f"SparseCsr{dispatch_key(device_type)}"
    for op in compressed:
        overload = _overload(op)
        kernel = (host_compressed.on_the_device_kernel(overload)
                  if op in compressed_layouts.ON_THE_DEVICE
                  else host_compressed.host_kernel(overload, device_type, observe))
        library.impl(op, kernel, compressed_key)


def _save_compressed_as_cuda_does(activation, device_type: str) -> None:
    """A compressed tensor of the target saved as CUDA saves one: its layout and its index and
    value tensors, which the checkpoint then names as CUDA's. Torch saves a tensor without
    storage of a PrivateUse1 device as a host copy rebuilt on that device by name (a checkpoint
    no machine without that device can load, map_location or not), and before 2.5 through
    numpy, which fails for a sparse tensor."""
    def make_reduce_ex(original):
        @functools.wraps(original)
        def __reduce_ex__(self, protocol):
            if self.device.type == device_type and host_compressed.is_compressed(self) \
                    and type(self) is torch.Tensor:
                return host_compressed.reduced(self)
            return original(self, protocol)
        return __reduce_ex__

    activation.replace(torch.Tensor, "__reduce_ex__", make_reduce_ex)


def _conversion_layout(op: str) -> str:
    """The layout a conversion (``aten::_to_sparse_csr``) makes, as torch names it."""
    return f"torch.sparse_{op.rpartition('_')[2]}"


def _overload(op: str):
    name, _, overload = op.partition(".")
    packet = getattr(torch.ops.aten, name)
    return getattr(packet, overload or "default")


def _host_kernel(held, overload):
    def kernel(*args, **kwargs):
        return held.on_host(overload, args, kwargs)
    kernel.__name__ = f"host_held_{overload.name().replace('::', '_')}"
    return kernel


class _WouldNest(Exception):
    """torch's TransformerEncoder is about to convert its input to a nested tensor."""


def _serve_nested_encoders(activation, device_type: str) -> None:
    """``nn.TransformerEncoder`` in inference with a padding mask (``enable_nested_tensor``, on
    by default) converts its input to a nested tensor on CUDA, the CPU, XPU and PrivateUse1
    devices: on a target without nested kernels that dies in the first layer. Where torch is
    about to convert, the encoder runs its layers on the padded tensor with the padding mask
    instead, and zeroes the padded positions before its final norm, as the nested path's
    ``to_padded_tensor(0.0)`` leaves them."""
    encoding = threading.local()        # inside an encoder's forward on this thread

    def make_from_mask(original):
        @functools.wraps(original)
        def nested_tensor_from_mask(tensor, mask, *args, **kwargs):
            if getattr(encoding, "active", False) and tensor.device.type == device_type:
                raise _WouldNest
            return original(tensor, mask, *args, **kwargs)
        return nested_tensor_from_mask

    def make_forward(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def forward(self, *args, **kwargs):
            outer = getattr(encoding, "active", False)
            encoding.active = True
            try:
                return original(self, *args, **kwargs)
            except _WouldNest:
                pass
            finally:
                encoding.active = outer
            call = signature.bind(self, *args, **kwargs).arguments
            if activation.reporting:
                activation.count("nn.TransformerEncoder's nested-tensor path",
                                 f"its layers on the padded batch ('{device_type}' has no nested kernels)")
            return _padded_encoder_forward(self, call["src"], call["src_key_padding_mask"],
                                           call.get("is_causal"))
        return forward

    activation.replace(torch, "_nested_tensor_from_mask", make_from_mask)
    activation.replace(torch.nn.TransformerEncoder, "forward", make_forward)


def _padded_encoder_forward(encoder, src, padding_mask, is_causal):
    """What torch's nested path computes, on the padded batch (``batch_first``, no attention
    mask: torch takes that path only so): each layer with the padding mask, then the padded
    positions zeroed, then the encoder's norm."""
    output = src
    for layer in encoder.layers:
        output = layer(output, src_mask=None, is_causal=is_causal is True,
                       src_key_padding_mask=padding_mask)
    padded = padding_mask if padding_mask.dtype is torch.bool else padding_mask != 0
    output = output.masked_fill(padded.unsqueeze(-1), 0.0)
    return encoder.norm(output) if encoder.norm is not None else output
