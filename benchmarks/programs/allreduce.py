"""Two ranks started as NCCL programs start themselves (``torch.multiprocessing.spawn``), each
all-reducing a float32 tensor on its CUDA device through the program's NCCL group, and the same
size of host memory through a gloo group, turn by turn. Rank 0 writes the times in ms.

    python -m cudashim --test-devices 2 benchmarks/programs/allreduce.py OUT.json --mib 64 --repeats 7
"""

import argparse
import json
import socket
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def timed(collective, tensor, group):
    dist.barrier(group=group)
    start = time.perf_counter()
    dist.all_reduce(tensor, group=collective)
    if tensor.is_cuda:
        torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1000


def run(rank, world, port, args):
    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    gloo = dist.new_group(backend="gloo")
    numel = args.mib * 2 ** 20 // 4
    device, host = torch.ones(numel, device="cuda"), torch.ones(numel)
    times = {"device": [], "host": []}
    for turn in range(args.repeats + 1):                  # the first turn warms up
        device_ms, host_ms = timed(None, device, gloo), timed(gloo, host, gloo)
        if turn:
            times["device"].append(device_ms)
            times["host"].append(host_ms)
    # every element was summed over both ranks each turn: the result says the device's moved
    expected = float(world ** (args.repeats + 1))
    correct = bool((device.cpu() == expected).all()) and bool((host == expected).all())
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump({"times": times, "correct": correct, "backend": dist.get_backend(),
                       "device": str(device.device)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(run, args=(2, port, args), nprocs=2, join=True)
