"""Programs on the test accelerator against the same programs on the CPU backend.

    python benchmarks/accelerator_programs.py [--json FILE] [--quick]

The test accelerator (``--test-devices 2``) is where a missed copy or a wrong device shows,
so real programs have to run on it at near the CPU's speed: its kernels are torch's CPU
kernels run on memory the host cannot touch, and what it adds (dispatch to its fallback,
host views of its memory, its collective library) should cost less than the program's own
work. Each program runs under cudashim on the CPU backend and on the test accelerator,
taking turns; a step's time is the median of the program's own step timer
(``--step-times``), its first five steps left out.
Target: at most 2x the CPU backend's time.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TARGET = 2.0
TARGETS = {"the CPU backend": (), "the test accelerator": ("--test-devices", "2")}


def _run(options, program, *arguments, torchrun=None):
    """``python -m cudashim`` over ``program`` (under torchrun with ``torchrun`` ranks),
    failing loudly."""
    launcher = ("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(torchrun)) \
        if torchrun else ()
    command = [sys.executable, "-m", "cudashim", *options, *launcher, os.path.join(ROOT, program),
               *arguments]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")


def step_time(program, steps, arguments, torchrun=None):
    """A program's median step, from its own timer (``--step-times``), its first five left out."""
    def step(options, workdir):
        times = os.path.join(workdir, "steps.json")
        _run(options, program, "--step-times", times, *arguments(steps, workdir), torchrun=torchrun)
        with open(times) as f:
            return statistics.median(json.load(f)[5:])
    return step


PROGRAMS = {
    "the GPT example, a training step (AMP, GradScaler)": lambda quick: step_time(
        "examples/gpt.py", 30 if quick else 60,
        lambda steps, workdir: ("--steps", str(steps), "--checkpoint", os.path.join(workdir, "ckpt.pt"))),
    "a GPT under DDP on two ranks (torchrun, AMP), a step": lambda quick: step_time(
        "tests/programs/gpt_ddp.py", 30 if quick else 60,
        lambda steps, workdir: ("--steps", str(steps), "--out", os.path.join(workdir, "ddp.pt")), torchrun=2),
    "the CNN example, a training step (batch 64, float32)": lambda quick: step_time(
        "examples/cnn.py", 2 if quick else 5, lambda epochs, workdir: ("--epochs", str(epochs))),
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
