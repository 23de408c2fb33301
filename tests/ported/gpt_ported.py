"""examples/gpt.py ported by hand, as a user would without cudashim, to the device named
by --device (the CPU by default; --vendor names the extension that device needs imported).

The reference the unmodified example must match, loss for loss, under cudashim.
"""

import argparse
import json
import math
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=60)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--checkpoint", default="runs/gpt/ckpt.pt")
parser.add_argument("--losses", help="write the training losses here as JSON")
parser.add_argument("--compile", action="store_true", help="train the torch.compile'd model")
parser.add_argument("--step-times", help="write each step's wall time in seconds here as JSON")
parser.add_argument("--n-embd", type=int, default=64, help="model width")
parser.add_argument("--n-layer", type=int, default=2, help="transformer blocks")
parser.add_argument("--block-size", type=int, default=32, help="context length")
parser.add_argument("--device", default="cpu")
parser.add_argument("--vendor", help="the vendor extension to import first (torch_npu, ...)")
parser.add_argument("--amp-dtype", default="float16", choices=["float16", "bfloat16", "float32"],
                    help="what the training step autocasts to (float32: autocast off), as a port "
                         "written for the device's fast dtype would")
parser.add_argument("--mkldnn-matmul-precision",
                    help="oneDNN's float32 matmul precision (bf16: what TF32 becomes on a CPU)")
args = parser.parse_args()
if args.vendor:
    __import__(args.vendor)

torch.manual_seed(1337)
device = args.device
device_type = torch.device(device).type
if args.mkldnn_matmul_precision:
    torch.backends.mkldnn.matmul.fp32_precision = args.mkldnn_matmul_precision
amp_dtype = torch.float16 if args.amp_dtype == "float32" else getattr(torch, args.amp_dtype)

# A corpus with structure worth learning: counting rhymes in a small alphabet.
words = ["one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten"]
text = " ".join(f"{words[i % 10]} {words[(i * 7) % 10]}." for i in range(2000))
vocab = sorted(set(text))
stoi = {ch: i for i, ch in enumerate(vocab)}
data = torch.tensor([stoi[ch] for ch in text], dtype=torch.long)
block_size, n_embd, n_head, n_layer = args.block_size, args.n_embd, 4, args.n_layer


def get_batch():
    ix = torch.randint(len(data) - block_size - 1, (args.batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + block_size + 1] for i in ix])
    return x.to(device), y.to(device)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok = nn.Embedding(len(vocab), n_embd)
        self.pos = nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, len(vocab))

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.blocks(self.tok(idx) + self.pos(pos))
        logits = self.head(self.ln_f(x))
        loss = None if targets is None else F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler(device_type)

train_model = torch.compile(model) if args.compile else model
losses, step_times = [], []
for step in range(args.steps):
    began = time.perf_counter()
    xb, yb = get_batch()
    with torch.autocast(device_type=device_type, dtype=amp_dtype, enabled=args.amp_dtype != "float32"):
        _, loss = train_model(xb, yb)
    optimizer.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    scaler.step(optimizer)
    scaler.update()
    losses.append(loss.item())                 # .item() waits for the step to finish
    step_times.append(time.perf_counter() - began)
    if step % 10 == 0 or step == args.steps - 1:
        print(f"step {step:4d} | loss {loss.item():.4f}")

import os  # noqa: E402
os.makedirs(os.path.dirname(args.checkpoint) or ".", exist_ok=True)
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": args.steps},
           args.checkpoint)
state = torch.load(args.checkpoint, map_location=device)
restored = GPT().to(device)
restored.load_state_dict(state["model"])
with torch.no_grad():
    xb, yb = get_batch()
    assert torch.equal(restored(xb)[0], model(xb)[0]), "checkpoint round trip changed the model"
print(f"checkpoint {args.checkpoint} restored; final loss {losses[-1]:.4f} "
      f"(perplexity {math.exp(losses[-1]):.2f})")
if args.losses:
    with open(args.losses, "w") as f:
        json.dump(losses, f)
if args.step_times:
    with open(args.step_times, "w") as f:
        json.dump(step_times, f)
