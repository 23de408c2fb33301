"""A CUDA program that leans on device memory being the device's own: copies, pinned
non-blocking transfers, events and streams, generators, AMP with a gradient scaler,
checkpoints saved on the device and loaded elsewhere, TorchScript, DataLoader workers.
It asserts what CUDA guarantees and writes the numbers it computed as JSON (argv[1])."""

import json
import sys

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

assert torch.cuda.is_available()
seen = {"device_count": torch.cuda.device_count()}
checkpoint = sys.argv[2]

# Tensors say they are CUDA tensors on cuda:0, and their memory is the device's.
x = torch.arange(6, dtype=torch.float32).reshape(2, 3).cuda()
assert x.is_cuda and x.get_device() == 0 and torch.cuda.current_device() == 0
assert x.device == torch.device("cuda", 0)
seen["device_index"] = x.device.index           # the real device's: None on the host
properties = torch.cuda.get_device_properties(0)     # the fields CUDA programs read
assert properties.total_memory > 0 and properties.multi_processor_count >= 1 and properties.name
assert (properties.major, properties.minor) == torch.cuda.get_device_capability(0)
seen["host_readable"] = True
try:
    x.numpy()
except TypeError:                      # "can't convert cuda:0 device type tensor to numpy"
    seen["host_readable"] = False
assert x.cpu().numpy().sum() == 15 and x.sum().item() == 15 and x.tolist()[1] == [3.0, 4.0, 5.0]

# Pinned memory, copied without blocking, then synchronized.
pinned = torch.full((4,), 2.0).pin_memory()
on_device = pinned.to("cuda", non_blocking=True)
back = torch.empty(4).pin_memory()
back.copy_(on_device * 3, non_blocking=True)
torch.cuda.synchronize()
assert back.tolist() == [6.0] * 4

# Events time the work between them; streams order it.
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
side = torch.cuda.Stream()
start.record()
with torch.cuda.stream(side):
    product = x @ x.T
torch.cuda.current_stream().wait_stream(side)
product.record_stream(torch.cuda.current_stream())
end.record()
end.synchronize()
assert start.elapsed_time(end) >= 0 and product.tolist() == [[5.0, 14.0], [14.0, 50.0]]

# A generator of the device's own gives the same numbers for the same seed.
generator = torch.Generator(device="cuda")
draws = [torch.randn(3, generator=generator.manual_seed(7), device="cuda").tolist() for _ in range(2)]
assert draws[0] == draws[1]

# AMP: float16 autocast and a gradient scaler over a few steps.
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).cuda()
optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
scaler = torch.cuda.amp.GradScaler()
inputs, targets = torch.randn(32, 8).cuda(), torch.randn(32, 1).cuda()
losses = []
for _ in range(4):
    optimizer.zero_grad()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = F.mse_loss(model(inputs), targets)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.item())
seen["amp_losses"] = losses
assert all(loss == loss for loss in losses) and scaler.get_scale() > 0

# A checkpoint saved from the device loads on the host (as any CUDA checkpoint does, with
# map_location) and back onto the device without one, bit for bit.
torch.save({"model": model.state_dict(), "step": 4}, checkpoint)
on_host = torch.load(checkpoint, map_location="cpu")
assert all(t.device.type == "cpu" for t in on_host["model"].values())
again = torch.load(checkpoint)
assert all(t.is_cuda for t in again["model"].values())
assert all(torch.equal(again["model"][k].cpu(), on_host["model"][k]) for k in on_host["model"])
seen["weights"] = {k: v.flatten()[:4].tolist() for k, v in on_host["model"].items()}
torch.save(on_host, checkpoint + ".host")            # and the other way: saved on the host,
to_device = torch.load(checkpoint + ".host", map_location="cuda")    # mapped onto CUDA
assert all(t.is_cuda and torch.equal(t.cpu(), on_host["model"][k]) for k, t in to_device["model"].items())


# TorchScript compiles CUDA device code against the target.
@torch.jit.script
def scaled(t: torch.Tensor) -> torch.Tensor:
    return (t.cuda() * 2).sum()


assert scaled(torch.ones(3)).item() == 6.0 and scaled(torch.ones(3)).is_cuda

# DataLoader workers with pinned batches.
loader = DataLoader(TensorDataset(torch.arange(16, dtype=torch.float32)), batch_size=4, num_workers=2,
                    pin_memory=True)
seen["loader_sum"] = sum(batch.cuda(non_blocking=True).sum().item() for (batch,) in loader)
assert seen["loader_sum"] == 120

seen["memory_allocated"] = torch.cuda.memory_allocated()
with open(sys.argv[1], "w") as f:
    json.dump(seen, f)
