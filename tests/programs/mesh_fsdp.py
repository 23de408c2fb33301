"""DeviceMesh and both FSDP spellings, written for CUDA: FSDP2 over a 1-D mesh and as HSDP (a
(replicate, shard) mesh, the gradients all-reduced over the replicas), and FSDP1 trained in
float16 (MixedPrecision) with its ShardedGradScaler, one rank's overflow skipping every rank's step."""

import copy
import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

try:
    from torch.distributed.fsdp import fully_shard               # torch 2.6 and later
except ImportError:
    from torch.distributed._composable.fsdp import fully_shard

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

rank = dist.get_rank()

# HSDP: each replica holds the whole model (a shard dimension of one) and trains on its part of the
# batch; the replicas' gradients are averaged, so a step is the full batch's step on one device
torch.manual_seed(0)
reference = torch.nn.Linear(8, 4).cuda()
hsdp = copy.deepcopy(reference)
fully_shard(hsdp, mesh=init_device_mesh("cuda", (world, 1), mesh_dim_names=("replicate", "shard")))
batch = torch.randn(2 * world, 8, generator=torch.Generator().manual_seed(1)).cuda()
for model_, inputs in ((reference, batch), (hsdp, batch.chunk(world)[rank])):
    optimizer = torch.optim.SGD(model_.parameters(), lr=0.5)
    model_(inputs).pow(2).mean().backward()
    optimizer.step()
as_one = all(torch.allclose(p.full_tensor(), r, atol=1e-6) for p, r in zip(hsdp.parameters(), reference.parameters()))
print(f"rank {rank}: HSDP over {world} replicas {'steps as one device' if as_one else 'DIFFERS'}")

# FSDP1 computing and reducing in float16, with ShardedGradScaler: a step, then an overflow on
# rank 0 alone, which every rank hears (the found-inf flags are all-reduced): no rank steps, and
# every rank's scale halves
from torch.distributed.fsdp import MixedPrecision
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

half = FSDP(torch.nn.Linear(8, 1), device_id=torch.cuda.current_device(),
            mixed_precision=MixedPrecision(param_dtype=torch.float16, reduce_dtype=torch.float16))
scaler = ShardedGradScaler(init_scale=2.0 ** 8)
optimizer = torch.optim.SGD(half.parameters(), lr=0.1)
moved = []
for overflow in (1.0, float("inf") if rank == 0 else 1.0):
    optimizer.zero_grad()
    before = [p.detach().clone() for p in half.parameters()]
    out = half(torch.randn(4, 8, device="cuda"))
    loss = out.float().pow(2).mean() * overflow
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    moved.append(any(not torch.equal(b, p) for b, p in zip(before, half.parameters())))
print(f"rank {rank}: ShardedGradScaler on {out.dtype}, stepped {moved}, scale {scaler.get_scale()}")

dist.barrier()
print(f"rank {rank}: mesh on {mesh.device_type}, fully_shard and FSDP trained")
dist.destroy_process_group()
