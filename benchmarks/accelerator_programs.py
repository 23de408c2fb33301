"""Programs on the test accelerator against the same programs on the CPU backend.

    python benchmarks/accelerator_programs.py [--json FILE] [--quick]

The test accelerator (``--test-devices 2``) is where a missed copy or a wrong device shows,
so real programs have to run on it at near the CPU's speed: its kernels are torch's CPU
kernels run on memory the host cannot touch, and what it adds (dispatch to its fallback,
host views of its memory, its collective library) should cost less than the program's own
work. Each program runs under cudashim on the CPU backend and on the test accelerator,
taking turns; a step's time is read without the start-up (the GPT example's own step
timer; elsewhere the difference between a long and a short run over the steps between).
Target: at most 2x the CPU backend's time.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TARGET = 2.0
TARGETS = {"the CPU backend": (), "the test accelerator": ("--test-devices", "2")}


def _run(options, program, *arguments, torchrun=None):
    """Seconds ``python -m cudashim`` takes over ``program`` (under torchrun with ``torchrun``
    ranks), failing loudly."""
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(torchrun)) \
        if torchrun else ()
    command = [sys.executable, "-m", "cudashim", *options, *launcher, os.path.join(ROOT, program),
               *arguments]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))}
    started = time.perf_counter()
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    return seconds


def gpt_step(options, workdir, steps):
    """The GPT example's median training step (AMP with a GradScaler), from its own timer."""
    times = os.path.join(workdir, "steps.json")
    _run(options, "examples/gpt.py", "--steps", str(steps), "--checkpoint", os.path.join(workdir, "ckpt.pt"),
         "--step-times", times)
    with open(times) as f:
        return statistics.median(json.load(f)[5:])


def by_difference(program, make_arguments, short, long, torchrun=None):
    """A step of ``program``: a long run's time less a short one's, over the steps between."""
    def step(options, workdir):
        return (_run(options, program, *make_arguments(long, workdir), torchrun=torchrun)
                - _run(options, program, *make_arguments(short, workdir), torchrun=torchrun)) / (long - short)
    return step


PROGRAMS = {
    "the GPT example, a training step (AMP, GradScaler)": lambda quick: (
        lambda options, workdir: gpt_step(options, workdir, 30 if quick else 60)),
    "a GPT under DDP on two ranks (torchrun), a step": lambda quick: by_difference(
        "tests/programs/gpt_ddp.py",
        lambda steps, workdir: ("--steps", str(steps), "--out", os.path.join(workdir, "ddp.pt")),
        short=4, long=24 if quick else 64, torchrun=2),
    "the CNN example, an epoch": lambda quick: by_difference(
        "examples/cnn.py", lambda epochs, workdir: ("--epochs", str(epochs)), short=1, long=4 if quick else 9),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results-accelerator_programs.json"))
    parser.add_argument("--quick", action="store_true", help="one round, shorter runs (a smoke run)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rounds = 1 if args.quick else args.rounds
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for what, make in PROGRAMS.items():
            step = make(args.quick)
            seconds = {name: [] for name in TARGETS}
            for _ in range(rounds):
                for name, options in TARGETS.items():
                    seconds[name].append(step(options, workdir))
            cpu, device = (statistics.median(seconds[name]) for name in TARGETS)
            ratio = device / cpu
            rows.append({"what": what, "cpu_ms": cpu * 1e3, "device_ms": device * 1e3, "ratio": ratio,
                         "target": TARGET, "met": ratio <= TARGET, "rounds": rounds})
            print(f"{what:55s} {cpu * 1e3:9.1f} ms {device * 1e3:9.1f} ms {ratio:6.2f}x "
                  f"(target {TARGET:.1f}x) {'yes' if ratio <= TARGET else 'NO'}", flush=True)
    with open(args.json, "w") as f:
        json.dump({"rows": rows, "targets": {name: list(options) for name, options in TARGETS.items()}}, f,
                  indent=1)
        f.write("\n")


if __name__ == "__main__":
    main()
