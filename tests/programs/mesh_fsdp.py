"""DeviceMesh and both FSDP spellings, written for CUDA."""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import fully_shard

dist.init_process_group("nccl")
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
world = dist.get_world_size()

mesh = init_device_mesh("cuda", (world,))
assert DeviceMesh("cuda", list(range(world))).size() == world

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer, mesh=mesh)
fully_shard(model, mesh=mesh)
model(torch.randn(4, 8, device="cuda")).sum().backward()
assert all(p.grad is not None for p in model.parameters())

torch.manual_seed(0)
legacy = FSDP(torch.nn.Linear(8, 1), device_id=torch.cuda.current_device())
legacy(torch.randn(4, 8, device="cuda")).sum().backward()

dist.barrier()
print(f"rank {dist.get_rank()}: mesh on {mesh.device_type}, fully_shard and FSDP trained")
dist.destroy_process_group()
