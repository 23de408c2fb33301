"""1-bit Adam on 2 ranks: Adam warm-up, then momentum averaged through 1-bit compression.

    torchrun --nproc-per-node 2 examples/onebit_adam.py                 # 1-bit Adam
    torchrun --nproc-per-node 2 examples/onebit_adam.py --optimizer adam  # the baseline

Runs on NCCL where CUDA is, on gloo elsewhere; the compression is cudashim.kernels'.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

from cudashim.kernels import CompressedBackend, error_buffer_size

parser = argparse.ArgumentParser()
parser.add_argument("--optimizer", choices=["onebit", "adam"], default="onebit")
parser.add_argument("--steps", type=int, default=300)
parser.add_argument("--warmup", type=int, default=50)
parser.add_argument("--lr", type=float, default=3e-3)
parser.add_argument("--losses", help="rank 0 writes the evaluation losses here as JSON")
args = parser.parse_args()

local_rank = int(os.environ.get("LOCAL_RANK", 0))
use_cuda = torch.cuda.is_available()
device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
dist.init_process_group("nccl" if use_cuda else "gloo")
rank, world = dist.get_rank(), dist.get_world_size()

# The same regression data on every rank; each trains on its own shard.
torch.manual_seed(0)
features = torch.randn(4096, 32)
targets = torch.tanh(features @ torch.randn(32, 1)) + 0.05 * torch.randn(4096, 1)
features, targets = features.to(device), targets.to(device)
shard = slice(rank, None, world)

model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1)).to(device)
params = list(model.parameters())


class OneBitAdam:
    """Adam for ``warmup`` steps with all-reduced gradients; then the variance is frozen and
    each rank's momentum is averaged with the error-compensated 1-bit allreduce."""

    def __init__(self, params, lr, warmup, betas=(0.9, 0.999), eps=1e-8):
        self.params, self.lr, self.warmup, self.eps = params, lr, warmup, eps
        self.beta1, self.beta2 = betas
        flat = torch.nn.utils.parameters_to_vector(params)
        self.m, self.v = torch.zeros_like(flat), torch.zeros_like(flat)
        self.backend = CompressedBackend()
        size = error_buffer_size(flat.numel(), self.backend.world_size)
        self.worker_error = torch.zeros(size, device=flat.device)
        self.server_error = torch.zeros(size // self.backend.world_size, device=flat.device)
        self.steps = 0

    @torch.no_grad()
    def step(self):
        grad = torch.cat([p.grad.reshape(-1) for p in self.params])
        self.steps += 1
        if self.steps <= self.warmup:
            dist.all_reduce(grad)
            grad /= self.backend.world_size
            self.m.mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
            self.v.mul_(self.beta2).addcmul_(grad, grad, value=1 - self.beta2)
        else:
            self.m.mul_(self.beta1).add_(grad, alpha=1 - self.beta1)
            self.backend.compressed_allreduce(self.m, self.worker_error, self.server_error)
        update = self.m / (self.v.sqrt() + self.eps)
        vector = torch.nn.utils.parameters_to_vector(self.params) - self.lr * update
        torch.nn.utils.vector_to_parameters(vector, self.params)


class AllReduceAdam:
    """The baseline: plain Adam on gradients averaged with a float all_reduce."""

    def __init__(self, params, lr):
        self.params, self.adam = params, torch.optim.Adam(params, lr=lr)

    def step(self):
        for p in self.params:
            dist.all_reduce(p.grad)
            p.grad /= world
        self.adam.step()


optimizer = OneBitAdam(params, args.lr, args.warmup) if args.optimizer == "onebit" else AllReduceAdam(params, args.lr)
losses = []
for step in range(args.steps):
    model.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(features[shard]), targets[shard])
    loss.backward()
    optimizer.step()
    if step % 25 == 0 or step == args.steps - 1:
        with torch.no_grad():
            full = torch.nn.functional.mse_loss(model(features), targets).item()
        losses.append(full)
        if rank == 0:
            print(f"step {step:4d} | loss on all data {full:.5f}")
if rank == 0 and args.losses:
    with open(args.losses, "w") as f:
        json.dump(losses, f)
dist.destroy_process_group()
