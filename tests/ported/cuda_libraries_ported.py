"""examples/cuda_libraries.py ported by hand to this CPU with torch's own operations:
scaled_dot_product_attention, torch.optim.AdamW, nn.LayerNorm, torch's memory figures."""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--losses")
args = parser.parse_args()

torch.manual_seed(0)
text = " ".join(f"{w} {w[::-1]}." for w in ["alpha", "beta", "gamma", "delta"] * 200)
vocab = sorted(set(text))
data = torch.tensor([vocab.index(c) for c in text])
block, width, heads = 32, 64, 4


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, width // heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(attended.transpose(1, 2).reshape(b, t, width))
        return x + self.mlp(self.ln2(x))


model = nn.Sequential(nn.Embedding(len(vocab), width), Block(), Block(), nn.LayerNorm(width),
                      nn.Linear(width, len(vocab)))
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
losses = []
for step in range(args.steps):
    starts = torch.randint(len(data) - block - 1, (16,))
    x = torch.stack([data[s:s + block] for s in starts])
    y = torch.stack([data[s + 1:s + block + 1] for s in starts])
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    losses.append(loss.item())
if args.losses:
    with open(args.losses, "w") as f:
        json.dump(losses, f)
