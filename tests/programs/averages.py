"""Averages and reduce-scatters, as code written for NCCL takes them: counts and batch sizes
(integers), losses and metrics, FSDP's float32 gradient reduce-scatter, HSDP's replica group.

Run by torchrun on two ranks. Each rank writes ``OUT.rankN.json``: what each collective left in
its tensors, and what a gloo group the program made itself answers.
"""

import argparse
import json

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    torch.cuda.set_device(rank)
    avg = dist.ReduceOp.AVG
    seen = {}

    counts = torch.tensor([5 + rank, -5 - rank, 7 * rank], device="cuda")      # sums 11, -11, 7
    dist.all_reduce(counts, op=avg)
    seen["all_reduce"] = [counts.tolist(), str(counts.dtype)]

    pending = torch.tensor([3 + rank], dtype=torch.int32, device="cuda")
    work = dist.all_reduce(pending, op=avg, async_op=True)
    work.wait()
    seen["all_reduce_async"] = pending.tolist()

    halves = torch.zeros(2, dtype=torch.int64, device="cuda")
    dist.reduce_scatter_tensor(halves, torch.arange(4, device="cuda") + 10 * rank, op=avg)
    seen["reduce_scatter_tensor"] = halves.tolist()

    kept = torch.tensor([9 + rank], device="cuda")
    dist.reduce(kept, dst=1, op=avg)
    seen["reduce_to_rank_1"] = kept.tolist()

    for dtype in (torch.float32, torch.bfloat16):
        name = str(dtype).rpartition(".")[2]
        loss = torch.tensor([1.0 + rank, 2.0 * rank], dtype=dtype, device="cuda")
        dist.all_reduce(loss, op=avg)
        seen[f"all_reduce {name}"] = [loss.tolist(), str(loss.dtype)]
        gradients = torch.arange(4, dtype=dtype, device="cuda") * (rank + 1)  # sums 0 3 6 9
        shard = torch.empty(2, dtype=dtype, device="cuda")
        dist.reduce_scatter_tensor(shard, gradients, op=avg)
        seen[f"reduce_scatter_tensor {name}"] = shard.tolist()
        metric = torch.tensor([4.0 * rank], dtype=dtype, device="cuda")
        dist.reduce(metric, dst=0, op=avg)
        if rank == 0:
            seen[f"reduce_to_rank_0 {name}"] = metric.tolist()

    pieces = [torch.full((2,), 10.0 * piece + rank, device="cuda") for piece in range(2)]
    mine = torch.empty(2, device="cuda")
    dist.reduce_scatter(mine, pieces)
    seen["reduce_scatter of a list"] = mine.tolist()
    dist.reduce_scatter(mine, pieces, op=avg)
    seen["reduce_scatter of a list, averaged"] = mine.tolist()

    # HSDP's layout: the replicas' subgroup of a (replicate, shard) mesh, made by DeviceMesh itself
    mesh = init_device_mesh("cuda", (2, 1), mesh_dim_names=("replicate", "shard"))
    steps = torch.tensor([4 + rank], device="cuda")                             # sum 9
    dist.all_reduce(steps, op=avg, group=mesh.get_group("replicate"))
    seen["mesh subgroup"] = steps.tolist()

    gloo = dist.new_group([0, 1], backend="gloo")
    try:
        dist.all_reduce(torch.tensor([1, 2]), op=avg, group=gloo)
        seen["own_gloo_group"] = "averaged"
    except RuntimeError as error:
        seen["own_gloo_group"] = str(error)

    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
