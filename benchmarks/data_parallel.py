"""What nn.DataParallel costs on the CPU target, against the same step in native PyTorch.

    python benchmarks/data_parallel.py [--json benchmarks/results-data-parallel.json] [--steps N]

A training step of a 3-layer MLP (256-512-512-10: forward, backward, SGD) on a batch of 1024, timed four ways,
each in its own process, rounds alternating: native PyTorch on the CPU (the module alone:
torch's DataParallel does not run there); under cudashim the module alone; under cudashim
``nn.DataParallel`` on one CUDA device (programs that wrap unconditionally); and on two
virtual devices (``--device-count 2``: two replicas per step on the one host). A row gives the
median step time over the steps after the warm-up, the best of the rounds (the
least disturbed by the machine's noise), and its ratio to native. The losses of the
first three must be equal bit for bit; two replicas sum their gradients in another order.

Target: DataParallel on one device within 1.10x of native (it scatters a view and calls the
module). Two virtual devices pay for CUDA's semantics with nothing to run them in parallel on
but the same cores: replication, two threads and a gather each step; reported, not targeted.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
VARIANTS = {                      # name: (cudashim options or None for native, wrap in DataParallel)
    "native, module alone": (None, False),
    "cudashim, module alone": ((), False),
    "cudashim, DataParallel on 1 device": ((), True),
    "cudashim, DataParallel on 2 virtual devices": (("--device-count", "2"), True),
}
TARGET = {"cudashim, DataParallel on 1 device": 1.10}
WARMUP = 5


def step_worker(wrap: bool, steps: int, out: str) -> None:
    import torch
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                          nn.Linear(512, 10))
    if torch.cuda.is_available():       # under cudashim; native runs it where a CPU port would
        model = model.cuda()
    device = next(model.parameters()).device
    if wrap:
        model = nn.DataParallel(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    batch, target = torch.randn(1024, 256).to(device), torch.randint(0, 10, (1024,)).to(device)
    times, losses = [], []
    for _ in range(WARMUP + steps):
        start = time.perf_counter()
        loss = nn.functional.cross_entropy(model(batch), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
        losses.append(loss.item())
    json.dump({"times": times[WARMUP:], "losses": losses}, open(out, "w"))


def run_variant(name: str, steps: int, out: str) -> dict:
    options, wrap = VARIANTS[name]
    launcher = [] if options is None else ["-m", "cudashim", *options]
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDASHIM_")}
    env.pop("PYTHONPATH", None)
    result = subprocess.run([sys.executable, *launcher, os.path.abspath(__file__), "--worker",
                             str(int(wrap)), "--steps", str(steps), "--json", out],
                            cwd=ROOT, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{name} failed:\n{result.stderr[-3000:]}")
    return json.load(open(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results-data-parallel.json"))
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker is not None:
        return step_worker(bool(args.worker), args.steps, args.json)

    samples = {name: [] for name in VARIANTS}
    losses = {}
    for round_ in range(args.rounds):
        for name in VARIANTS:
            seen = run_variant(name, args.steps, f"{args.json}.{round_}.part")
            samples[name].append(statistics.median(seen["times"]))
            losses[name] = seen["losses"]
    for round_ in range(args.rounds):
        os.remove(f"{args.json}.{round_}.part")
    same_losses = (losses["native, module alone"] == losses["cudashim, module alone"]
                   == losses["cudashim, DataParallel on 1 device"])
    native = min(samples["native, module alone"])
    rows = []
    print(f"{'training step, batch 1024':<46} {'median ms':>10} {'x native':>9} {'target':>7}")
    for name, medians in samples.items():
        median = min(medians)
        ratio = median / native
        target = TARGET.get(name)
        rows.append({"what": name, "median_ms": median * 1e3, "ratio": ratio, "target": target,
                     "met": None if target is None else ratio <= target,
                     "round_medians_ms": [m * 1e3 for m in medians]})
        print(f"{name:<46} {median * 1e3:>10.3f} {ratio:>8.2f}x {'' if target is None else f'{target:.2f}x':>7}")
    print(f"losses equal bit for bit (native, shimmed, DataParallel on 1 device): {same_losses}")
    with open(args.json, "w") as f:
        json.dump({"rows": rows, "same_losses": same_losses, "torch": __import__("torch").__version__,
                   "machine": platform.machine(), "cpus": os.cpu_count()}, f, indent=1)
    print(f"written: {args.json}")


if __name__ == "__main__":
    main()
