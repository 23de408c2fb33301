"""float16 inference as CUDA programs write it: a trained GPT made ``.half()`` on the GPU,
then greedy generation.

    python -m cudashim benchmarks/programs/generate.py examples/gpt.py --times OUT.json
    python benchmarks/programs/generate.py tests/ported/gpt_ported.py --device cpu --dtype float32 ...

PROGRAM (the example, or its hand port) trains one step and hands over its model; options
this script does not know go to PROGRAM (``--n-embd 128``). The times of each generation
after a warm-up one, and the tokens, are written to ``--times`` as JSON.
"""

import argparse
import runpy
import sys

import torch
from generations import time_generations

parser = argparse.ArgumentParser()
parser.add_argument("program")
parser.add_argument("--device", default="cuda")
parser.add_argument("--dtype", default="float16")
parser.add_argument("--tokens", type=int, default=24)
parser.add_argument("--batch", type=int, default=8)
parser.add_argument("--repeats", type=int, default=3)
parser.add_argument("--times", required=True)
args, program_args = parser.parse_known_args()

sys.argv = [args.program, "--steps", "1", "--checkpoint", args.times + ".ckpt", *program_args]
trained = runpy.run_path(args.program, run_name="__main__")
model = trained["model"].to(device=args.device, dtype=getattr(torch, args.dtype)).eval()
context = trained["block_size"]
prompt = trained["get_batch"]()[0][:args.batch, :8].to(args.device)


@torch.no_grad()
def generate(idx):
    for _ in range(args.tokens):
        logits, _ = model(idx[:, -context:])
        idx = torch.cat([idx, logits[:, -1].argmax(-1, keepdim=True)], dim=1)
    return idx


time_generations(generate, prompt, args.repeats, args.device, args.times)
