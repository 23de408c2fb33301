"""CUDA-graph replay against eager execution of the same decode step, on the CPU.

    python benchmarks/graphs.py [--json benchmarks/results-graphs.json] [--rounds 7] [--steps 50]

A decoder of a few layers with a key/value cache of fixed size generates one token per step,
as fast LLM inference code does before it captures the step in a CUDA graph. Three ways, in
one process:

- native eager: the step run by plain PyTorch, before cudashim is activated;
- shimmed eager: the unmodified CUDA program's step under cudashim (CPU backend);
- replay: the step captured once with ``torch.cuda.graph`` and replayed under cudashim.

Shimmed eager and replay are measured interleaved, round by round; each figure is the median
per-step time over the rounds. Target: replay no slower than native eager, faster where
Python overhead dominates (the small model).
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

SIZES = {"small (dim 64, 4 layers)": (64, 4), "larger (dim 512, 4 layers)": (512, 4)}
LENGTH = 64


class Layer(torch.nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm1, self.norm2 = torch.nn.LayerNorm(dim), torch.nn.LayerNorm(dim)
        self.qkv, self.proj = torch.nn.Linear(dim, 3 * dim), torch.nn.Linear(dim, dim)
        self.up, self.down = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        self.register_buffer("keys", torch.zeros(1, LENGTH, dim))
        self.register_buffer("values", torch.zeros(1, LENGTH, dim))

    def forward(self, x, position, visible):
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        self.keys.index_copy_(1, position, k)
        self.values.index_copy_(1, position, v)
        scores = (q @ self.keys.transpose(1, 2)).masked_fill(~visible, float("-inf"))
        x = x + self.proj(F.softmax(scores / q.shape[-1] ** 0.5, dim=-1) @ self.values)
        return x + self.down(F.gelu(self.up(self.norm2(x))))


class Decoder(torch.nn.Module):
    def __init__(self, dim, layers, vocab=256):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.layers = torch.nn.ModuleList(Layer(dim) for _ in range(layers))
        self.head = torch.nn.Linear(dim, vocab)
        self.register_buffer("positions", torch.arange(LENGTH))

    def step(self, token, position):
        visible = (self.positions <= position).view(1, 1, -1)
        x = self.embed(token)
        for layer in self.layers:
            x = layer(x, position, visible)
        return self.head(x)[:, -1].argmax(-1, keepdim=True)


def per_step(run, steps):
    start = time.perf_counter()
    for i in range(steps):
        run(i % LENGTH)
    return (time.perf_counter() - start) / steps * 1e6        # microseconds


@torch.no_grad()
def decoder_step(dim, layers, device):
    torch.manual_seed(0)
    model = Decoder(dim, layers).to(device).eval()
    token = torch.tensor([[1]], device=device)
    position = torch.zeros(1, dtype=torch.long, device=device)

    def eager(i):
        position.fill_(i)
        model.step(token, position)
    return model, token, position, eager


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results-graphs.json"))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--steps", type=int, default=50)
    options = parser.parse_args()
    torch.set_num_threads(1)

    native = {}
    for name, (dim, layers) in SIZES.items():
        _, _, _, eager = decoder_step(dim, layers, "cpu")
        with torch.no_grad():
            per_step(eager, 5)
            native[name] = statistics.median(per_step(eager, options.steps) for _ in range(options.rounds))

    import cudashim
    cudashim.activate(backend="cpu")
    rows = []
    for name, (dim, layers) in SIZES.items():
        model, token, position, eager = decoder_step(dim, layers, "cuda")
        with torch.no_grad():
            per_step(eager, 5)                                    # warm-up, as before a capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                model.step(token, position)

            def replay(i):
                position.fill_(i)
                graph.replay()
            shimmed, replayed = [], []
            for _ in range(options.rounds):
                shimmed.append(per_step(eager, options.steps))
                replayed.append(per_step(replay, options.steps))
        row = {"model": name, "native_eager_us": native[name], "shimmed_eager_us": statistics.median(shimmed),
               "replay_us": statistics.median(replayed),
               "replay_spread_us": [min(replayed), max(replayed)],
               "recorded_ops": len(graph._steps), "replayed_calls": len(graph._replay.calls)}
        row["replay_vs_native"] = row["replay_us"] / row["native_eager_us"]
        row["replay_vs_shimmed"] = row["replay_us"] / row["shimmed_eager_us"]
        row["meets_target"] = row["replay_vs_native"] <= 1.0
        rows.append(row)
    cudashim.deactivate()

    print(f"{'model':28} {'native eager':>13} {'shimmed eager':>14} {'replay':>10} "
          f"{'replay/native':>14} {'ops rerun':>10}")
    for row in rows:
        print(f"{row['model']:28} {row['native_eager_us']:11.1f}us {row['shimmed_eager_us']:12.1f}us "
              f"{row['replay_us']:8.1f}us {row['replay_vs_native']:13.2f}x "
              f"{row['replayed_calls']:>4}/{row['recorded_ops']}")
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=os.path.dirname(os.path.abspath(__file__))).stdout.strip()
    with open(options.json, "w") as out:
        json.dump({"host": platform.processor() or platform.machine(), "python": sys.version.split()[0],
                   "torch": torch.__version__, "commit": commit, "threads": 1, "rows": rows}, out, indent=2)


if __name__ == "__main__":
    main()
