"""Pipeline, data and tensor parallelism on one 3-D device mesh, as the training frameworks compose
them for large models, written for CUDA.

torchrun --nproc-per-node 4 mesh_3d.py OUT.json

The mesh is (pp=2, dp=WORLD/4, tp=2). Each pipeline stage holds half of the blocks. Within a stage
each block's two projections are split column-wise and row-wise over "tp", and the blocks are
sharded with FSDP2 over "dp". A GPipe schedule trains three steps over two microbatches. Rank 0
writes the last stage's losses, the same model trained unsplit on one device, and whether every
rank's weights (gathered from their shards) equal the unsplit model's.
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

try:
    from torch.distributed.fsdp import fully_shard               # torch 2.6 and later
except ImportError:
    from torch.distributed._composable.fsdp import fully_shard

WIDTH, BLOCKS, MICROBATCHES, STEPS = 16, 4, 2, 3
PP, TP = 2, 2


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(WIDTH, 2 * WIDTH)
        self.down = nn.Linear(2 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(x)))


def loss_fn(output, target):
    return nn.functional.mse_loss(output, target)


def stage_of(model, mesh):
    """This rank's pipeline stage: its blocks split over "tp", then sharded over "dp"."""
    stage_index = mesh["pp"].get_local_rank()
    per_stage = BLOCKS // PP
    blocks = model[stage_index * per_stage:(stage_index + 1) * per_stage]
    for block in blocks:
        parallelize_module(block, mesh["tp"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(blocks, mesh=mesh["dp"])
    return stage_index, per_stage, blocks


def main():
    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = torch.device("cuda", torch.cuda.current_device())
    mesh = init_device_mesh("cuda", (PP, world // (PP * TP), TP), mesh_dim_names=("pp", "dp", "tp"))

    torch.manual_seed(0)
    model = nn.Sequential(*[Block() for _ in range(BLOCKS)]).to(device)
    unsplit = nn.Sequential(*[Block() for _ in range(BLOCKS)]).to(device)
    unsplit.load_state_dict(model.state_dict())
    inputs = torch.randn(2 * MICROBATCHES, WIDTH, device=device)
    targets = torch.randn(2 * MICROBATCHES, WIDTH, device=device)

    stage_index, per_stage, blocks = stage_of(model, mesh)
    stage = PipelineStage(blocks, stage_index, PP, device, input_args=inputs.chunk(MICROBATCHES)[0],
                          group=mesh["pp"].get_group())
    schedule = ScheduleGPipe(stage, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    optimizer = torch.optim.SGD(blocks.parameters(), lr=0.1)
    losses = []
    for _ in range(STEPS):
        optimizer.zero_grad()
        step_losses = []
        if stage_index == 0:
            schedule.step(inputs)
        else:
            schedule.step(target=targets, losses=step_losses)
        optimizer.step()
        if step_losses:
            losses.append(torch.stack([loss.detach() for loss in step_losses]).mean().item())

    # torch 2.4's schedules add the microbatches' gradients; later ones average them
    averaged = "scale_grads" in ScheduleGPipe.__init__.__code__.co_varnames
    unsplit_optimizer = torch.optim.SGD(unsplit.parameters(), lr=0.1)
    expected = []
    for _ in range(STEPS):
        unsplit_optimizer.zero_grad()
        loss = sum(loss_fn(unsplit(x), y) for x, y in zip(inputs.chunk(MICROBATCHES), targets.chunk(MICROBATCHES)))
        (loss / MICROBATCHES if averaged else loss).backward()
        unsplit_optimizer.step()
        expected.append(loss.item() / MICROBATCHES)

    # Parameters, not state_dict(): torch 2.4 has no state dict for FSDP2 over tensor parallelism.
    theirs = dict(unsplit[stage_index * per_stage:(stage_index + 1) * per_stage].named_parameters())
    weights_equal = all(torch.allclose(value.full_tensor(), theirs[name], rtol=1e-4, atol=1e-6)
                        for name, value in blocks.named_parameters())
    shared = [None] * world
    dist.all_gather_object(shared, (losses, weights_equal, str(blocks[0].up.weight.to_local().device)))
    if rank == 0:
        with open(sys.argv[1], "w") as out:
            json.dump({"losses": next(found for found, _, _ in shared if found), "unsplit": expected,
                       "weights_equal": all(equal for _, equal, _ in shared),
                       "devices": sorted({device for _, _, device in shared})}, out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
