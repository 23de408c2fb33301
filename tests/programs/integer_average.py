"""Averages of integer tensors, as code written for NCCL takes them (counts, batch sizes).

Run by torchrun on two ranks. Each rank writes ``OUT.rankN.json``: what each averaging
collective left in its tensors, and what a gloo group the program made itself answers.
"""

import argparse
import json

import torch
import torch.distributed as dist


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

    floats = torch.tensor([1.0 + rank], device="cuda")
    dist.all_reduce(floats, op=avg)
    seen["float"] = floats.tolist()

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
