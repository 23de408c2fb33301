"""A small CUDA training script as users write them: one GPU, or one per rank under torchrun
with NCCL. The README's commands run it (tests/test_docs.py); it is not cudashim's code."""

import argparse
import os

import torch
import torch.distributed as dist
from torch import nn

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--lr", type=float, default=0.05)
args = parser.parse_args()

assert torch.cuda.is_available(), "this script needs a CUDA GPU"
distributed = "WORLD_SIZE" in os.environ
if distributed:
    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)).cuda()
if distributed:
    model = nn.parallel.DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
scaler = torch.amp.GradScaler("cuda")
inputs = torch.randn(64, 8).cuda(non_blocking=True)
targets = inputs.sum(1, keepdim=True) * 0.1   # losses small enough that float16 steps from the first

for epoch in range(args.epochs):
    with torch.autocast("cuda", dtype=torch.float16):
        loss = nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    if not distributed or dist.get_rank() == 0:
        print(f"epoch {epoch}: loss {loss.item():.3f}")

if distributed:
    dist.destroy_process_group()
