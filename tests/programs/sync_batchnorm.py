"""SyncBatchNorm under DDP, as CUDA programs convert a model for it (torchvision's and timm's
``--sync-bn``): each rank normalizes its share of a batch with the statistics of the whole
batch. Every rank also computes plain BatchNorm over the whole batch and writes how far the
synchronized output, input gradient and running statistics are from it (argv[1].rankN.json).
"""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn

dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
local_rank = int(os.environ["LOCAL_RANK"])
torch.cuda.set_device(local_rank)

torch.manual_seed(0)
reference = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4)).cuda()
model = nn.SyncBatchNorm.convert_sync_batchnorm(
    nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4))).cuda()
model.load_state_dict(reference.state_dict())
model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])

seen = {"worst": {}}
for step in range(3):
    batch = torch.randn(4 * world, 3, 6, 6, generator=torch.Generator().manual_seed(step)).cuda()
    share = batch[4 * rank:4 * (rank + 1)].clone().requires_grad_()
    whole = batch.clone().requires_grad_()
    out = model(share)
    expected = reference(whole)
    out.square().sum().backward()
    expected.square().sum().backward()       # the whole batch's loss is the sum of the shares'
    differences = {
        "output": (out - expected[4 * rank:4 * (rank + 1)]).abs().max().item(),
        "input_grad": (share.grad - whole.grad[4 * rank:4 * (rank + 1)]).abs().max().item(),
        "running_mean": (model.module[1].running_mean - reference[1].running_mean).abs().max().item(),
        "running_var": (model.module[1].running_var - reference[1].running_var).abs().max().item(),
    }
    for name, value in differences.items():
        seen["worst"][name] = max(value, seen["worst"].get(name, 0.0))
assert out.is_cuda and isinstance(model.module[1], nn.SyncBatchNorm)
seen["device"] = str(out.device)
with open(f"{sys.argv[1]}.rank{rank}.json", "w") as f:
    json.dump(seen, f)
dist.destroy_process_group()
