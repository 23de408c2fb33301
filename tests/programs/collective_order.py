"""Asynchronous collectives written for NCCL, which completes a group's work in issue order.

As DeepSpeed's ZeRO-3 gathers parameters: several asynchronous all-gathers into fresh
buffers, a wait on the last handle only, then every buffer read. Also a blocking collective
after asynchronous ones, ``is_completed()`` and ``get_future()`` of the last handle, and the
same on a subgroup. Each rank writes ``OUT.rankN.json``: how many reads found a buffer that
a collective had not yet filled (NaN where the gather has not written).
"""

import argparse
import json
import os

import torch
import torch.distributed as dist

TRIALS = 40
SIZES = (1 << 18, 1 << 16, 64, 8)            # the first one takes longest


def launch(group, rank, world):
    outputs = [torch.full((size * world,), float("nan"), device="cuda") for size in SIZES]
    handles = [dist.all_gather_into_tensor(out, torch.full((size,), rank + 1.0, device="cuda"),
                                           group=group, async_op=True)
               for out, size in zip(outputs, SIZES)]
    return outputs, handles


def unfilled(outputs) -> int:
    return sum(int(torch.isnan(out).any()) for out in outputs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    subgroup = dist.new_group(list(range(world)))
    seen = {"wait_on_last": 0, "blocking_after": 0, "is_completed": 0, "future": 0, "subgroup": 0}
    for _ in range(TRIALS):
        outputs, handles = launch(None, rank, world)
        handles[-1].wait()
        seen["wait_on_last"] += unfilled(outputs)
        for handle in handles:
            handle.wait()

        outputs, handles = launch(None, rank, world)
        dist.all_reduce(torch.ones(1, device="cuda"))           # blocking: returns in order
        seen["blocking_after"] += unfilled(outputs)

        outputs, handles = launch(None, rank, world)
        while not handles[-1].is_completed():
            pass
        seen["is_completed"] += unfilled(outputs)
        for handle in handles:
            handle.wait()

        outputs, handles = launch(None, rank, world)
        handles[-1].get_future().wait()
        seen["future"] += unfilled(outputs)
        for handle in handles:
            handle.wait()

        outputs, handles = launch(subgroup, rank, world)
        handles[-1].wait()
        seen["subgroup"] += unfilled(outputs)
        for handle in handles:
            handle.wait()
    with open(f"{args.out}.rank{rank}.json", "w") as f:
        json.dump(seen, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
