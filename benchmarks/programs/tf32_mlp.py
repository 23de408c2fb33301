"""float32 training with TF32 allowed, as CUDA programs write it.

    python -m cudashim benchmarks/programs/tf32_mlp.py --times OUT.json
    python benchmarks/programs/tf32_mlp.py --device cpu [--mkldnn-matmul-precision bf16] ...

Each step's wall time after two warm-up steps is written to ``--times`` as JSON.
"""

import argparse
import json
import time

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--device", default="cuda")
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--width", type=int, default=1024)
parser.add_argument("--mkldnn-matmul-precision", help="the hand port's oneDNN float32 precision")
parser.add_argument("--times", required=True)
args = parser.parse_args()

torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
if args.mkldnn_matmul_precision:
    torch.backends.mkldnn.matmul.fp32_precision = args.mkldnn_matmul_precision
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(args.width, 4 * args.width), nn.GELU(),
                      nn.Linear(4 * args.width, args.width)).to(args.device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
x = torch.randn(256, args.width, device=args.device)
times = []
for step in range(args.steps + 2):
    start = time.perf_counter()
    loss = model(x).pow(2).mean()
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    loss.item()
    times.append(time.perf_counter() - start)
with open(args.times, "w") as out:
    json.dump({"times": times[2:], "loss": loss.item()}, out)
