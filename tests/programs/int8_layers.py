"""Layers and an optimizer state quantized with bitsandbytes, written for CUDA as an 8-bit
LoRA script loads its base model: 8-bit and 4-bit linear layers moved with .to("cuda"), and
AdamW8bit stepping a model on "cuda"."""

import torch
import torch.nn as nn

import bitsandbytes as bnb

torch.manual_seed(0)
base = nn.Linear(64, 64)
x = torch.randn(4, 64, device="cuda")
reference = base.cuda()(x)

int8 = bnb.nn.Linear8bitLt(64, 64, has_fp16_weights=False)
int8.load_state_dict(base.state_dict())
int8 = int8.to("cuda")
nf4 = bnb.nn.Linear4bit(64, 64, compute_dtype=torch.float32, quant_type="nf4")
nf4.load_state_dict(base.state_dict())
nf4 = nf4.to("cuda")

with torch.no_grad():
    errors = [(layer(x) - reference).abs().mean().item() / reference.abs().mean().item()
              for layer in (int8, nf4)]

model = nn.Linear(64, 1).cuda()
optimizer = bnb.optim.AdamW8bit(model.parameters(), lr=1e-2)
losses = []
for _ in range(20):
    loss = (model(x) - 1).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())

assert all(error < 0.2 for error in errors), errors
assert losses[-1] < losses[0], losses
print(f"quantized layers within {max(errors):.3f}, loss {losses[0]:.3f} -> {losses[-1]:.3f}")
