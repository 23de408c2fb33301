"""Attention on DTensors, sharded as torch shards it on CUDA.

Tensor-parallel attention as torchtitan and PyTorch's FSDP + TP example write it keeps the
query, key and value DTensors with their heads sharded (``ColwiseParallel(use_local_output=False)``)
and calls ``F.scaled_dot_product_attention`` on them. torch shards that call through the
strategies it registers for CUDA's attention kernels (flash, memory-efficient, cuDNN): per mesh
dimension, everything replicated, the heads sharded, or the batch sharded. Another device's
attention reaches DTensor as something else, which it cannot shard: the host's flash kernel
("Operator aten._scaled_dot_product_flash_attention_for_cpu.default does not have a sharding
strategy registered"), or, where a device's attention takes the math path (the test accelerator,
torchvulkan), the math's own ops, whose causal mask is a plain tensor ("aten.add.Tensor got mixed
torch.Tensor and DTensor"). Every such target failed the program at its first attention.

Here attention on DTensors computes what torch's CUDA strategies compute. Per mesh dimension the
placement the query, key and value share is kept where it shards a batch or head dimension, and
everything else (a sharded sequence, a pending reduction, placements that differ) is replicated
first, as torch's propagation would redistribute it. Each rank then runs the target's own
attention on its shards, and the result is a DTensor of the same placements; ``to_local`` and
``from_local`` carry the gradients back. A mask follows the dimensions it does not broadcast
over. Dropout draws from the device's generator on each rank, as CUDA's flash kernel does under
DTensor (torch does not count it among DTensor's random ops).

Context parallelism shards the sequence instead, and torch computes that only through the
handlers it installs for CUDA's attention ops while its context is active (ring attention:
each rank's query against every rank's key and value blocks in turn, merged by their
log-sum-exp). Where those handlers are installed and the query, key and value share a sharded
sequence, the call goes to CUDA's op, as CUDA's ``scaled_dot_product_attention`` sends it:
flash attention, or memory-efficient attention where there is a mask (which torch's ring
refuses, as on CUDA). The ring then runs the ops on each rank's blocks with cudashim's kernels
for the target (``kernels/fused_attention.py``).
"""

from __future__ import annotations

import functools

import torch

from ... import torch_names

# DTensor's public module from torch 2.5; its private one before (and an alias after).
MODULES = ("torch.distributed.tensor", "torch.distributed._tensor")
# Arguments after (query, key, value), in the order torch's signature takes them.
_MASK = "attn_mask"
_ARGUMENTS = (("attn_mask", None), ("dropout_p", 0.0), ("is_causal", False), ("scale", None),
              ("enable_gqa", False))


def install(activation) -> None:
    if activation.backend.device_type == "cuda":      # CUDA's own kernels have torch's strategies
        return
    patched = []

    def patch(module) -> None:
        if patched:                                   # one patch, reached by two module names
            return
        names = [torch_names.get(f"{module.__name__}.{name}", None, import_modules=False)
                 for name in ("DTensor", "Replicate", "Shard")]
        if None in names:
            return
        patched.append(module)
        handlers = functools.partial(torch_names.get, f"{module.__name__}.DTensor._op_dispatcher."
                                     "_custom_op_handlers", {}, import_modules=False)
        activation.replace(torch.nn.functional, "scaled_dot_product_attention",
                           lambda original: sharded_attention(original, *names, handlers))

    for name in MODULES:
        activation.when_imported(name, patch)


def sharded_attention(original, dtensor, replicate, shard, handlers=dict):
    """``F.scaled_dot_product_attention`` that shards DTensors as torch's CUDA strategies do, and
    passes every other call to ``original`` after one type check. ``handlers()``: DTensor's
    custom op handlers as they are now (context parallelism installs its own)."""
    @functools.wraps(original)
    def scaled_dot_product_attention(query, key, value, *args, **kwargs):
        if not isinstance(query, dtensor) or not isinstance(key, dtensor) \
                or not isinstance(value, dtensor) or not _same_mesh(query, key, value):
            return original(query, key, value, *args, **kwargs)     # torch's own answer
        if _sequence_sharded(query, key, value) \
                and torch.ops.aten._scaled_dot_product_flash_attention.default in handlers():
            return ring_attention(query, key, value, *args, **kwargs)
        placements = shared_placements(query, key, value, replicate)
        local = [_local(t, placements) for t in (query, key, value)]
        args, kwargs = _mask_sharded(query, placements, args, kwargs, dtensor, replicate, shard)
        output = original(*local, *args, **kwargs)
        return dtensor.from_local(output, query.device_mesh, placements, run_check=False)
    return scaled_dot_product_attention


def _sequence_sharded(query, key, value) -> bool:
    """Whether the three share a placement that shards the sequence (the dimension before the
    embedding) on some mesh dimension."""
    sequence = query.ndim - 2
    return any(placement.is_shard() and placement.dim % query.ndim == sequence
               and key.placements[mesh_dim] == placement and value.placements[mesh_dim] == placement
               for mesh_dim, placement in enumerate(query.placements))


def ring_attention(query, key, value, *args, **kwargs):
    """The call as CUDA's ``scaled_dot_product_attention`` makes it: flash attention, or with a
    mask memory-efficient attention, on the DTensors (context parallelism's handlers run it as
    ring attention)."""
    bound = dict(_ARGUMENTS)
    bound.update(zip(bound, args))
    bound.update(kwargs)
    if bound["attn_mask"] is not None:
        return torch.ops.aten._scaled_dot_product_efficient_attention(
            query, key, value, bound["attn_mask"], query.requires_grad, bound["dropout_p"],
            bound["is_causal"], scale=bound["scale"])[0]
    return torch.ops.aten._scaled_dot_product_flash_attention(
        query, key, value, bound["dropout_p"], bound["is_causal"], scale=bound["scale"])[0]


def _same_mesh(*tensors) -> bool:
    mesh = tensors[0].device_mesh
    return all(t.device_mesh == mesh and t.ndim == tensors[0].ndim for t in tensors)


def shared_placements(query, key, value, replicate) -> tuple:
    """Per mesh dimension: the placement all three share where it shards a dimension before the
    sequence (a batch or the heads), else Replicate."""
    leading = query.ndim - 2                          # (..., sequence, embedding)
    chosen = []
    for mesh_dim in range(query.device_mesh.ndim):
        placement = query.placements[mesh_dim]
        shared = all(t.placements[mesh_dim] == placement for t in (key, value))
        if shared and placement.is_shard() and placement.dim % query.ndim < leading:
            chosen.append(placement)
        else:
            chosen.append(replicate())
    return tuple(chosen)


def _local(tensor, placements):
    if tuple(tensor.placements) != placements:
        tensor = tensor.redistribute(tensor.device_mesh, placements)
    return tensor.to_local()


def _mask_sharded(query, placements, args, kwargs, dtensor, replicate, shard):
    """The arguments with a mask cut to this rank's shard: sharded where the query is and the
    mask does not broadcast, whole elsewhere."""
    in_args = len(args) > 0
    mask = args[0] if in_args else kwargs.get(_MASK)
    if not isinstance(mask, torch.Tensor):
        return args, kwargs
    offset = query.ndim - mask.ndim                   # a mask's dimensions align on the right
    wanted = []
    for placement in placements:
        dim = placement.dim % query.ndim - offset if placement.is_shard() else -1
        wanted.append(shard(dim) if dim >= 0 and mask.shape[dim] != 1 else replicate())
    wanted = tuple(wanted)
    if isinstance(mask, dtensor):
        local = _local(mask, wanted)
    elif all(p.is_replicate() for p in wanted):
        return args, kwargs
    else:                                             # a plain mask: this rank's slice, no collective
        whole = dtensor.from_local(mask, query.device_mesh, [replicate()] * len(wanted), run_check=False)
        local = whole.redistribute(query.device_mesh, wanted).to_local()
    if in_args:
        return (local, *args[1:]), kwargs
    return args, {**kwargs, _MASK: local}
