"""DeepSpeed's 1-bit backends against a torch simulation, as DeepSpeed's own backend tests
check them, in a program written for NVIDIA GPUs (``cuda`` tensors, ``nccl``).

Each backend compresses two buffers of random values (biased per rank, so that few lie near
zero) whose lengths need padding to whole bytes per rank, a short one and a long one. The simulation does the same
arithmetic with plain tensors and a float32 all_reduce. Rank 0 writes, per backend, the
largest differences from the simulation: of the result, and of the errors carried.
"""

import argparse
import json
import os

import numpy as np
import torch
import deepspeed
import deepspeed.comm as dist


def signs(x):
    """+1 where x >= 0 (zero counts as positive), -1 elsewhere."""
    return (x >= 0).float().mul_(2).sub_(1)


def simulate(buffer, world, rank):
    """The 1-bit allreduce from zero errors, with float tensors throughout."""
    scale = buffer.norm() / np.sqrt(buffer.numel())
    compressed = scale * signs(buffer)
    worker_error = buffer - compressed
    torch.distributed.all_reduce(compressed)
    compressed.mul_(1 / world)
    chunks = torch.chunk(compressed, world)
    server_scales = [chunk.norm() / np.sqrt(chunk.numel()) for chunk in chunks]
    result = torch.cat([s * signs(chunk) for s, chunk in zip(server_scales, chunks)])
    server_error = chunks[rank] - server_scales[rank] * signs(chunks[rank])
    return result, worker_error, server_error


def compare(backend, values, world, rank):
    padded = -(-values.numel() // (8 * world)) * 8 * world
    worker_error = torch.zeros(padded, device="cuda")
    server_error = torch.zeros(padded // world, device="cuda")
    padded_values = torch.cat([values, torch.zeros(padded - values.numel(), device="cuda")])
    expected, expected_worker, expected_server = simulate(padded_values.clone(), world, rank)
    result = backend.compressed_allreduce(values.clone(), worker_error, server_error, rank)
    # Where the averaged value is tiny, float rounding may flip its sign; DeepSpeed's tests
    # skip those positions, and so does this.
    settled = (torch.chunk(expected, world)[rank] + expected_server).abs() > 1e-6
    return {"result": (result - expected[:values.numel()]).abs().max().item(),
            "worker_error": (worker_error - expected_worker).abs().max().item(),
            "server_error": ((server_error - expected_server).abs() * settled).max().item(),
            "shape_kept": list(result.shape) == list(values.shape),
            "device": str(result.device), "is_cuda": result.is_cuda}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    deepspeed.init_distributed(dist_backend="nccl")
    torch.cuda.set_device(args.local_rank)
    world, rank = dist.get_world_size(), dist.get_rank()

    from deepspeed.runtime.comm.nccl import NcclBackend
    from deepspeed.runtime.comm.compressed import CompressedBackend
    torch.manual_seed(7 + rank)
    seen = {}
    # A short buffer, and a long one whose norms CUDA's tree reductions keep exact (DeepSpeed's
    # own test compresses 300 * 2**20 values).
    for length in (10_003, 2 ** 22 + 3):
        values = (torch.rand(length, device="cuda") - 0.5) + 0.01 * rank
        for backend in (NcclBackend(), CompressedBackend()):
            seen[f"{type(backend).__name__}, {length} values"] = {
                "module": type(backend).__module__, **compare(backend, values, world, rank)}
    if rank == 0:
        with open(args.out, "w") as f:
            json.dump(seen, f)


if __name__ == "__main__":
    main()
