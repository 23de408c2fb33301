"""Small-batch decoding as CUDA inference scripts write it: a decoder made ``.half().cuda()``,
a key/value cache, greedy tokens one at a time for a batch of 2.

    python -m cudashim benchmarks/programs/decode.py --times OUT.json
    python benchmarks/programs/decode.py --device cpu --dtype bfloat16 --times OUT.json

Each token's matmuls have as many rows as the batch: memory-bound, the weights read once per
token. The times of each generation after a warm-up one, and the tokens, go to ``--times``.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from generations import time_generations

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda")
parser.add_argument("--dtype", default="float16")
parser.add_argument("--width", type=int, default=1024)
parser.add_argument("--layers", type=int, default=4)
parser.add_argument("--heads", type=int, default=16)
parser.add_argument("--vocab", type=int, default=4096)
parser.add_argument("--batch", type=int, default=2)
parser.add_argument("--prompt", type=int, default=8)
parser.add_argument("--tokens", type=int, default=24)
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--times", required=True)
args = parser.parse_args()


class Block(nn.Module):
    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.out = nn.Linear(width, width)
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x, cache):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if cache:
            k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
        cache[:] = [k, v]
        y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(args.vocab, args.width)
        self.blocks = nn.ModuleList(Block(args.width, args.heads) for _ in range(args.layers))
        self.norm = nn.LayerNorm(args.width)
        self.head = nn.Linear(args.width, args.vocab, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=1 / math.sqrt(p.shape[-1]))

    def forward(self, idx, caches):
        x = self.embed(idx)
        for block, cache in zip(self.blocks, caches):
            x = block(x, cache)
        return self.head(self.norm(x))


torch.manual_seed(0)
model = Decoder().to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
prompt = torch.randint(0, args.vocab, (args.batch, args.prompt), device=args.device)


@torch.no_grad()
def generate(idx):
    caches = [[] for _ in model.blocks]
    logits = model(idx, caches)
    for _ in range(args.tokens):
        token = logits[:, -1].argmax(-1, keepdim=True)
        idx = torch.cat([idx, token], dim=1)
        logits = model(token, caches)
    return idx


time_generations(generate, prompt, args.repeats, args.device, args.times)
