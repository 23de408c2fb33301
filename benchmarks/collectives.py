"""Collectives staged through host memory against gloo on host tensors, in the same run.

    python benchmarks/collectives.py [--json benchmarks/results-collectives.json] [--quick]

A target without a collective library of its own (torchvulkan; the test accelerator's
``shimccl`` takes the same path) runs the program's NCCL collectives as gloo's on host copies
of its device tensors (``cudashim/backends/staged.py``). Two ranks on the test accelerator
all-reduce a float32 tensor through the program's NCCL group and the same size of host memory
through a gloo group, turn by turn (``benchmarks/programs/allreduce.py``); speed is gloo's
median time over the staged one's. Target: at least half of gloo's speed. Each rank computes
on one thread, as torchrun starts ranks (``OMP_NUM_THREADS=1``): two ranks of two threads each
on a 2-core machine spend their time in OpenMP's spinning, which no collective path decides.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
TARGET = 0.5
SIZES_MIB = (1, 16, 64)


def measure(mib, repeats, workdir):
    out = os.path.join(workdir, f"allreduce-{mib}.json")
    command = [sys.executable, "-m", "cudashim", "--test-devices", "2",
               os.path.join(ROOT, "benchmarks", "programs", "allreduce.py"), out,
               "--mib", str(mib), "--repeats", str(repeats)]
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, (ROOT, os.environ.get("PYTHONPATH"))))}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=900)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{result.stderr[-3000:]}")
    with open(out) as f:
        seen = json.load(f)
    staged, gloo = (statistics.median(seen["times"][side]) for side in ("device", "host"))
    speed = gloo / staged
    return {"what": f"all_reduce, {mib} MiB float32, 2 ranks", "staged_ms": staged, "gloo_ms": gloo,
            "speed": speed, "target": TARGET, "met": "yes" if speed >= TARGET else "no",
            "correct": seen["correct"], "backend": seen["backend"], "device": seen["device"]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results-collectives.json"))
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        rows = [measure(mib, 3 if args.quick else 9, workdir) for mib in SIZES_MIB]
    print(f"{'what':40s} {'staged':>10s} {'gloo':>10s} {'speed':>7s}  target  met")
    for row in rows:
        print(f"{row['what']:40s} {row['staged_ms']:8.1f}ms {row['gloo_ms']:8.1f}ms {row['speed']:6.2f}x  "
              f"{row['target']:.1f}x    {row['met']}{'' if row['correct'] else '  (WRONG RESULT)'}")
    with open(args.json, "w") as f:
        json.dump({"rows": rows}, f, indent=1)
        f.write("\n")
    print(f"wrote {args.json}")
    if not all(row["correct"] for row in rows):
        sys.exit("a staged all_reduce gave a wrong result")


if __name__ == "__main__":
    main()
