"""An unmodified NCCL training script, as people write them for torchrun on GPUs."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--out", required=True)
parser.add_argument("--tcp", action="store_true", help="tcp:// rendezvous instead of env://")
args = parser.parse_args()

local_rank = int(os.environ["LOCAL_RANK"])
if args.tcp:
    dist.init_process_group(backend="nccl", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
                            rank=int(os.environ["RANK"]), world_size=int(os.environ["WORLD_SIZE"]))
else:
    dist.init_process_group("nccl")
torch.cuda.set_device(local_rank)
assert dist.get_backend() == "nccl"
rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(0)
data = TensorDataset(torch.randn(256, 16), torch.randn(256, 1))
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).to(local_rank)
model = DDP(model, device_ids=[local_rank], output_device=local_rank)
sampler = DistributedSampler(data, shuffle=False)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler, pin_memory=True)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

for epoch in range(args.epochs):
    sampler.set_epoch(epoch)
    for x, y in loader:
        x, y = x.cuda(local_rank, non_blocking=True), y.to(local_rank, non_blocking=True)
        optimizer.zero_grad()
        torch.nn.functional.mse_loss(model(x), y).backward()
        optimizer.step()

# the collectives NCCL scripts use, on "cuda" tensors
t = torch.full((4,), float(rank + 1), device="cuda")
dist.all_reduce(t)
gathered = [torch.zeros(4, device="cuda") for _ in range(world)]
dist.all_gather(gathered, t)
dist.broadcast(t, src=0)
part = torch.zeros(1, device=f"cuda:{local_rank}")
dist.reduce_scatter_tensor(part, torch.arange(world, dtype=torch.float32, device="cuda"))
assert t.tolist() == [world * (world + 1) / 2] * 4 and part.item() == rank * world
dist.barrier(device_ids=[local_rank])

if rank == 0:
    torch.save(model.module.state_dict(), args.out)
dist.destroy_process_group()
