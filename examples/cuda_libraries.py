"""A small GPT trained the way CUDA-only code is written: flash_attn for attention, apex's
FusedAdam and FusedLayerNorm, pynvml for GPU telemetry. Written for an NVIDIA GPU.

    python examples/cuda_libraries.py                  # on a CUDA machine with those packages
    python -m cudashim examples/cuda_libraries.py      # anywhere else, unmodified
"""

import argparse
import json

import pynvml
import torch
import torch.nn as nn
import torch.nn.functional as F
from apex.normalization import FusedLayerNorm
from apex.optimizers import FusedAdam
from flash_attn import flash_attn_func

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--losses", help="write the training losses here as JSON")
args = parser.parse_args()

assert torch.cuda.is_available(), "this script needs a CUDA GPU"
torch.manual_seed(0)
pynvml.nvmlInit()
gpu = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
print(f"training on {pynvml.nvmlDeviceGetName(gpu)}")

text = " ".join(f"{w} {w[::-1]}." for w in ["alpha", "beta", "gamma", "delta"] * 200)
vocab = sorted(set(text))
data = torch.tensor([vocab.index(c) for c in text], device="cuda")
block, width, heads = 32, 64, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = FusedLayerNorm(width), FusedLayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, width // heads).unbind(dim=2)
        x = x + self.proj(flash_attn_func(q, k, v, causal=True).reshape(b, t, width))
        return x + self.mlp(self.ln2(x))


model = nn.Sequential(nn.Embedding(len(vocab), width), Block(), Block(), FusedLayerNorm(width),
                      nn.Linear(width, len(vocab))).cuda()
optimizer = FusedAdam(model.parameters(), lr=3e-3, weight_decay=0.01)
losses = []
for step in range(args.steps):
    starts = torch.randint(len(data) - block - 1, (16,), device="cuda")
    x = torch.stack([data[s:s + block] for s in starts])
    y = torch.stack([data[s + 1:s + block + 1] for s in starts])
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
memory = pynvml.nvmlDeviceGetMemoryInfo(gpu)
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; GPU memory used {memory.used / 2**20:.0f} MiB "
      f"of {memory.total / 2**20:.0f} MiB")
pynvml.nvmlShutdown()
if args.losses:
    with open(args.losses, "w") as f:
        json.dump(losses, f)
