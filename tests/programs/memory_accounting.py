"""A CUDA program that reads torch.cuda's memory figures the way training code does.

- A tensor made on the device raises ``memory_allocated`` by at least its size, and deleting it
  gives the memory back (the allocation checks of a test suite).
- The memory tracker of a trainer: reset the peak, run a step, read the peak and the delta.
- Optimizer states offloaded to pinned host buffers by swapping ``.data`` and brought back
  (DeepSpeed's ``offload_states``): the device memory falls, then rises again, and training
  goes on with the same numbers.
- A generation script's closing line, ``torch.cuda.max_memory_reserved()``.

Run under ``python -m cudashim``; writes what it saw as JSON to the path given.
"""

import gc
import json
import sys

import torch
import torch.nn as nn

MIB = 2 ** 20
seen = {}

# --- an allocation and its release -------------------------------------------------------
torch.cuda.synchronize()
gc.collect()
base = torch.cuda.memory_allocated()
block = torch.empty(4 * MIB // 4, device="cuda")
grown = torch.cuda.memory_allocated() - base
view = block[1:]
del block
kept_by_view = torch.cuda.memory_allocated() - base
del view
gc.collect()
released = torch.cuda.memory_allocated() - base
seen["allocation"] = {"grown": grown >= 4 * MIB, "kept_by_view": kept_by_view >= 4 * MIB,
                      "released": released < MIB}

# --- a model, an optimizer, a step under a memory tracker ---------------------------------
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(256, 512), nn.GELU(), nn.Linear(512, 256)).cuda()
parameter_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
after_model = torch.cuda.memory_allocated() - base
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
inputs = torch.randn(32, 256, device="cuda")


def step():
    optimizer.zero_grad(set_to_none=True)
    loss = (model(inputs) - inputs).pow(2).mean()
    loss.backward()
    optimizer.step()
    return loss.item()


torch.cuda.reset_peak_memory_stats()
begin = torch.cuda.memory_allocated()
losses = [step() for _ in range(3)]
torch.cuda.synchronize()
peak_delta = torch.cuda.max_memory_allocated() - begin
end = torch.cuda.memory_allocated()
seen["tracker"] = {
    "model_counted": after_model >= parameter_bytes,
    # Adam's two moments are device memory as large as the parameters
    "states_counted": end - begin >= 2 * parameter_bytes,
    "peak_covers_the_step": peak_delta >= end - begin > 0,
}

# --- offload the optimizer's states to pinned host buffers, and bring them back ------------
before_offload = torch.cuda.memory_allocated()
for state in optimizer.state.values():
    for key in ("exp_avg", "exp_avg_sq"):
        buffer = torch.empty_like(state[key], device="cpu", pin_memory=torch.cuda.is_available())
        buffer.copy_(state[key], non_blocking=True)
        state[key].data = buffer
torch.cuda.synchronize()
after_offload = torch.cuda.memory_allocated()
offloaded_to_host = all(s["exp_avg"].device.type == "cpu" for s in optimizer.state.values())
for state in optimizer.state.values():
    for key in ("exp_avg", "exp_avg_sq"):
        state[key].data = state[key].data.to("cuda", non_blocking=True)
torch.cuda.synchronize()
after_reload = torch.cuda.memory_allocated()
losses += [step() for _ in range(2)]
seen["offload"] = {
    "falls": after_offload < before_offload,
    "by_the_states": before_offload - after_offload >= 2 * parameter_bytes,
    "on_the_host": offloaded_to_host,
    "rises_again": after_reload > after_offload,
}
seen["losses"] = losses

# --- the figures every tool reads ----------------------------------------------------------
stats = torch.cuda.memory_stats()
reserved_peak = torch.cuda.max_memory_reserved()
print(f"Memory used: {reserved_peak / 1e9:.02f} GB")
seen["figures"] = {
    "stats_agree": stats["allocated_bytes.all.current"] == torch.cuda.memory_allocated(),
    "reserved_covers_allocated": reserved_peak >= torch.cuda.max_memory_allocated() > 0,
    "summary": "allocated" in torch.cuda.memory_summary(),
}

with open(sys.argv[1], "w") as f:
    json.dump(seen, f)
