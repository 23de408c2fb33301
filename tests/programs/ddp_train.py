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
parser.add_argument("--zero", action="store_true",
                    help="shard the optimizer's state over the ranks (ZeroRedundancyOptimizer), as llm.c's "
                         "GPT-2 trainer does, and gather it on rank 0 at the end")
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
if args.zero:
    from torch.distributed.optim import ZeroRedundancyOptimizer
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.SGD, lr=0.05, momentum=0.9)
else:
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

if args.zero:
    optimizer.consolidate_state_dict(to=0)         # each rank's shard of the momentum, on rank 0's host
    if rank == 0:
        state = optimizer.state_dict()["state"]
        assert len(state) == len(list(model.parameters())), state.keys()
        momentum = [entry["momentum_buffer"] for entry in state.values()]
        assert all(buffer.device.type == "cpu" and buffer.abs().sum() > 0 for buffer in momentum), momentum
if rank == 0:
    torch.save(model.module.state_dict(), args.out)
dist.destroy_process_group()
