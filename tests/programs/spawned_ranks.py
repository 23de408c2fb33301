"""One rank per GPU with torch.multiprocessing.spawn, as NCCL programs written before
torchrun start themselves: each spawned process joins the group, takes its device and
all-reduces a tensor there. Each rank writes what it saw to OUT.rankN.json."""

import json
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def run(rank, world, port, out):
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    tensor = torch.full((3,), float(rank + 1), device=f"cuda:{rank}")
    dist.all_reduce(tensor)
    with open(f"{out}.rank{rank}.json", "w") as f:
        json.dump({"sum": tensor.tolist(), "is_cuda": tensor.is_cuda, "current": torch.cuda.current_device(),
                   "device": str(tensor.device),
                   "backend": dist.get_backend()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    world = torch.cuda.device_count()
    mp.spawn(run, args=(world, port, sys.argv[1]), nprocs=world, join=True)
