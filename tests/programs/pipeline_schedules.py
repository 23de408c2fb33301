"""Pipeline parallelism with torch.distributed.pipelining, written for CUDA as its tutorial
writes it: a model split into stages, one or two per rank, trained by a schedule.

torchrun --nproc-per-node 2 pipeline_schedules.py OUT.json

For each schedule (GPipe, 1F1B, interleaved 1F1B), the last stage's losses and every
stage's weights after three steps are compared with the unsplit model trained on one device
by the same microbatches. Rank 0 writes {schedule: {"losses", "reference", "weights_equal"}}.
"""

import inspect
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

LAYERS, WIDTH, MICROBATCHES, STEPS = 8, 16, 4, 3
# Schedules that take scale_grads average the microbatches' gradients; torch 2.4's add them.
AVERAGED = "scale_grads" in inspect.signature(ScheduleGPipe.__init__).parameters


def loss_fn(output, target):
    return nn.functional.mse_loss(output, target)


def run(schedule_class, stages_per_rank, device, rank, world):
    torch.manual_seed(0)
    full = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]).to(device)
    reference = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]).to(device)
    reference.load_state_dict(full.state_dict())
    inputs = torch.randn(2 * MICROBATCHES, WIDTH, device=device)
    targets = torch.randn(2 * MICROBATCHES, WIDTH, device=device)

    stage_count = world * stages_per_rank
    per_stage = LAYERS // stage_count
    indices = [rank + world * local for local in range(stages_per_rank)]     # looped placement
    modules = [full[index * per_stage:(index + 1) * per_stage] for index in indices]
    # a microbatch's shape: torch 2.4's stages need it to allocate their receive buffers
    example = torch.empty(2, WIDTH, device=device)
    stages = [PipelineStage(module, index, stage_count, device, input_args=example)
              for module, index in zip(modules, indices)]
    schedule = schedule_class(stages if stages_per_rank > 1 else stages[0], n_microbatches=MICROBATCHES,
                              loss_fn=loss_fn)
    optimizer = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.1)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        step_losses = []
        if rank == 0:
            schedule.step(inputs, target=targets, losses=step_losses)
        else:
            schedule.step(target=targets, losses=step_losses)
        optimizer.step()
        if step_losses:
            losses.append(float(torch.stack(step_losses).mean()))

    reference_optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    expected = []
    for _ in range(STEPS):
        reference_optimizer.zero_grad()
        loss = sum(loss_fn(reference(x), y) for x, y in zip(inputs.chunk(MICROBATCHES),
                                                            targets.chunk(MICROBATCHES)))
        if AVERAGED:
            loss = loss / MICROBATCHES
        loss.backward()
        reference_optimizer.step()
        expected.append(float(loss) / (1 if AVERAGED else MICROBATCHES))
    mine = [(index * per_stage + offset, layer) for index, module in zip(indices, modules)
            for offset, layer in enumerate(module)]
    weights_equal = all(torch.allclose(layer.weight, reference[position].weight, rtol=1e-4, atol=1e-6)
                        for position, layer in mine)
    # the last stage's rank has the losses: every rank learns them, and whether all weights agree
    shared = [None] * world
    dist.all_gather_object(shared, (losses, weights_equal))
    losses = next(found for found, _ in shared if found)
    return {"losses": losses, "reference": expected, "weights_equal": all(equal for _, equal in shared)}


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device())
    seen = {
        "GPipe": run(ScheduleGPipe, 1, device, rank, world),
        "1F1B": run(Schedule1F1B, 1, device, rank, world),
        "Interleaved1F1B": run(ScheduleInterleaved1F1B, 2, device, rank, world),
    }
    if rank == 0:
        with open(sys.argv[1], "w") as out:
            json.dump(seen, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
