"""DTensor's all-to-all on torch before 2.7, over collectives staged through host memory.

Resharding a DTensor from one dimension to another (``Shard(0)`` to ``Shard(1)``) is an
all-to-all, which torch runs as the op ``_dtensor::shard_dim_alltoall``: the list all-to-all of
the group's backend for the device. Under a collective library staged through host memory
(torchvulkan's, the test accelerator's) that backend is gloo, which before torch 2.7 has no
list all-to-all ("Backend gloo does not support alltoall"). For gloo torch itself takes another
path, on a CPU mesh: an all-gather and this rank's slice of it. A mesh of the target's device
takes that path too where its collectives are staged; from torch 2.7 the staged library runs
the all-to-all itself.
"""

from __future__ import annotations

import functools

import torch

from ... import torch_names
from ...backends import staged

# The module that defines it and the one that imports it by name, in each torch's layout.
MODULES = ("torch.distributed._tensor._collective_utils", "torch.distributed._tensor.placement_types",
           "torch.distributed.tensor._collective_utils", "torch.distributed.tensor.placement_types")
_GLOO_HAS_ALLTOALL = (2, 7)


def install(activation) -> None:
    target = activation.backend
    if torch.torch_version.TorchVersion(torch.__version__) >= _GLOO_HAS_ALLTOALL \
            or target.collective not in staged.LIBRARIES:
        return
    for name in MODULES:
        activation.when_imported(name, lambda module: activation.replace(
            module, "shard_dim_alltoall", lambda original: gathered_and_sliced(original, target.device_type)))


def gathered_and_sliced(original, device_type):
    @functools.wraps(original)
    def shard_dim_alltoall(input, gather_dim, shard_dim, mesh, mesh_dim):
        if mesh.device_type != device_type:
            return original(input, gather_dim, shard_dim, mesh, mesh_dim)
        collectives = torch_names.get("torch.distributed._functional_collectives")
        gathered = collectives.all_gather_tensor(input, gather_dim, (mesh, mesh_dim))
        wait = getattr(gathered, "wait", None)          # an AsyncCollectiveTensor
        if wait is not None:
            gathered = wait()
        mine = torch.chunk(gathered, mesh.size(mesh_dim), dim=shard_dim)[mesh.get_local_rank(mesh_dim)]
        return mine.contiguous()
    return shard_dim_alltoall
