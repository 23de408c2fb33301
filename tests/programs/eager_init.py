"""A trainer's prologue written for CUDA on recent torch: eager init with a bound device
(DeepSpeed and torchtitan pass device_id on every multi-rank run), device-generic helpers
dispatched on the device's type, and CUDA names passed to torch's own helpers."""

import os

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

local_rank = int(os.environ["LOCAL_RANK"])
device = torch.device("cuda", local_rank)
torch.cuda.set_device(device)
dist.init_process_group("nccl", device_id=device)

device_module = getattr(torch, device.type)             # as accelerate and PEFT examples do
dtype = torch.bfloat16 if device_module.is_bf16_supported() else torch.float16
device_module.manual_seed_all(1234)
device_module.empty_cache()

mesh = DeviceMesh.from_group(dist.group.WORLD, "cuda")
config = [{"lr": 3e-4, "dtype": str(dtype)} if dist.get_rank() == 0 else None]
dist.broadcast_object_list(config, src=0, device=device)

with torch.random.fork_rng(devices=[local_rank]):
    noise = torch.randn(4, device=device)
total = torch.ones(2, device=device) * (dist.get_rank() + 1)
dist.all_reduce(total, group=mesh.get_group())
torch.accelerator.synchronize(device)

expected = sum(range(1, dist.get_world_size() + 1))
assert total.tolist() == [expected, expected], total
assert config[0]["lr"] == 3e-4
print(f"rank {dist.get_rank()}: bound {dist.get_backend()}, {device_module.__name__}, "
      f"{device_module.memory_allocated(device) > 0}, {config[0]['dtype']}", flush=True)
dist.destroy_process_group()
