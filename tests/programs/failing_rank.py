"""Rank 1 fails after a collective; rank 0 would wait for it forever at the barrier."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("nccl")
t = torch.ones(2, device="cuda")
dist.all_reduce(t)
if dist.get_rank() == 1:
    raise ValueError(f"rank 1 gives up (local rank {os.environ['LOCAL_RANK']})")
dist.barrier()
