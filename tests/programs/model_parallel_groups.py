"""Model-parallel process groups as Megatron's and fairscale's initialize_model_parallel build
them, written for NCCL: every rank calls new_group for every group, members or not, and
each group runs a collective. Then the other group APIs: new_subgroups,
new_subgroups_by_enumeration, split_group and DeviceMesh sub-meshes.

Usage: torchrun --nproc-per-node N model_parallel_groups.py TENSOR_PARALLEL PIPELINE_PARALLEL
"""

import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def check_sum(group, members, spelled="nccl"):
    """all_reduce the rank in ``group`` on its members; a non-member gets nothing to do.
    The program hears its group's backend as it spelled it."""
    if dist.get_rank() not in members:
        return
    value = torch.tensor([float(dist.get_rank())], device="cuda")
    dist.all_reduce(value, group=group)
    assert value.item() == float(sum(members)), (value.item(), members)
    assert dist.get_backend(group) == spelled, dist.get_backend(group)


tensor_parallel, pipeline_parallel = int(sys.argv[1]), int(sys.argv[2])
dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
rank, world = dist.get_rank(), dist.get_world_size()
data_parallel = world // (tensor_parallel * pipeline_parallel)
pipeline_stride = world // pipeline_parallel

built = 0
# Data-parallel groups: within each pipeline stage, the ranks that share a tensor-parallel slot.
for stage in range(pipeline_parallel):
    for slot in range(tensor_parallel):
        members = list(range(stage * pipeline_stride + slot, (stage + 1) * pipeline_stride, tensor_parallel))
        check_sum(dist.new_group(members, backend="nccl"), members)
        built += 1
# Tensor-parallel groups: consecutive ranks.
for start in range(0, world, tensor_parallel):
    members = list(range(start, start + tensor_parallel))
    check_sum(dist.new_group(members), members)
    built += 1
# Pipeline groups: one rank per stage, strided.
for first in range(pipeline_stride):
    members = list(range(first, world, pipeline_stride))
    check_sum(dist.new_group(members, backend="nccl", use_local_synchronization=True)
              if rank in members else None, members)
    built += 1

# A group that leaves most ranks out, as a player/trainer split does.
loners = [0]
group = dist.new_group(loners, backend="nccl")
assert (group == dist.GroupMember.NON_GROUP_MEMBER) == (rank not in loners)
check_sum(group, loners)

subgroup, subgroups = dist.new_subgroups(group_size=tensor_parallel, backend="nccl")
check_sum(subgroup, dist.get_process_group_ranks(subgroup))
assert len(subgroups) == world // tensor_parallel
halves = [list(range(0, world, 2)), list(range(1, world, 2))]
subgroup, _ = dist.new_subgroups_by_enumeration(halves, backend="cuda:nccl")
check_sum(subgroup, halves[rank % 2], spelled="cuda:nccl")

split = dist.split_group(split_ranks=halves)
if split is not None:
    check_sum(split, halves[rank % 2])
else:
    assert rank not in sum(halves, [])

mesh = init_device_mesh("cuda", (data_parallel * pipeline_parallel, tensor_parallel),
                        mesh_dim_names=("dp", "tp"))
tp_mesh = mesh["tp"]
check_sum(tp_mesh.get_group(), tp_mesh.mesh.flatten().tolist())
dp_mesh = mesh["dp"]
check_sum(dp_mesh.get_group(), dp_mesh.mesh.flatten().tolist())

dist.barrier()
print(f"rank {rank}: {built} model-parallel groups, subgroups, split and sub-meshes ran collectives")
dist.destroy_process_group()
