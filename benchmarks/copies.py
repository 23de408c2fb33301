"""What the copies between host and device cost where device memory is host memory.

On the CPU backend cudashim makes the copy CUDA makes at each move between host and device
(``cudashim/residency.py``); torch alone would alias. Each row runs one CUDA program under
cudashim twice per round, with those copies and without them (``--disable residency``), the two
taking turns, and compares the median times; the copies the report counted are printed beside.

    python benchmarks/copies.py [--quick] [--json PATH]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

from measure import quartiles  # noqa: E402

# name, target (the ratio with copies to without), program and its arguments, the times' key,
# whether its first times are a warm-up to drop (decode.py drops its own warm-up generation)
PROGRAMS = [
    ("GPT training step (examples/gpt.py)", "1.02x",
     ["examples/gpt.py", "--steps", "{steps}", "--checkpoint", "{out}.pt", "--losses", "{out}.losses.json",
      "--step-times", "{out}.times"], None, True),
    ("greedy decoding with a KV cache, .half().cuda() (benchmarks/programs/decode.py)", "1.02x",
     ["benchmarks/programs/decode.py", "--times", "{out}.times", "--repeats", "{repeats}"], "times", False),
]


def run_once(program, with_copies, out, steps, report=False):
    """One run under cudashim; with ``report``, the number of copies the report counted."""
    args = [a.format(out=out, steps=steps, repeats=max(2, steps // 8)) for a in program]
    options = ([] if with_copies else ["--disable", "residency"]) + \
        (["--report-json", out + ".report.json"] if report else [])
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDASHIM_")}
    result = subprocess.run([sys.executable, "-m", "cudashim", *options, *args], cwd=ROOT, env=env,
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{result.stderr[-3000:]}")
    if not report:
        return None
    with open(out + ".report.json") as f:
        apis = json.load(f)["apis"]
    return sum(entry["calls"] for api, entry in apis.items() if api.endswith(", a copy"))


def times_of(path, key):
    with open(path) as f:
        data = json.load(f)
    return data[key] if key else data


def measure(name, target, program, key, drops_warmup, rounds, steps, warmup, workdir):
    warmup = warmup if drops_warmup else 0
    samples = {True: [], False: []}
    copies = run_once(program, True, os.path.join(workdir, "counted"), steps, report=True)
    for i in range(rounds):
        for with_copies in (True, False):
            out = os.path.join(workdir, f"{with_copies}-{i}")
            run_once(program, with_copies, out, steps)
            samples[with_copies].extend(t * 1e3 for t in times_of(out + ".times", key)[warmup:])
    mine, without = statistics.median(samples[True]), statistics.median(samples[False])
    ratio = mine / without
    low, high = quartiles([a / b for a, b in zip(samples[True], samples[False])])
    verdict = ("unresolved (target within the spread)" if low <= float(target[:-1]) <= high
               else "yes" if ratio <= float(target[:-1]) else "no")
    return {"what": name, "target": target, "with_copies_ms": mine, "without_ms": without, "ratio": ratio,
            "ratio_spread": [low, high], "met": verdict, "copies_per_run": copies}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results-copies.json"))
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps (a smoke run)")
    options = parser.parse_args()
    rounds, steps, warmup = (1, 12, 2) if options.quick else (3, 40, 5)
    rows = []
    with tempfile.TemporaryDirectory() as workdir:
        for name, target, program, key, drops_warmup in PROGRAMS:
            rows.append(measure(name, target, program, key, drops_warmup, rounds, steps, warmup, workdir))
    print(f"{'what':80s} {'target':>6s} {'with':>9s} {'without':>9s} {'ratio':>6s} {'copies':>6s}  met")
    for row in rows:
        print(f"{row['what']:80s} {row['target']:>6s} {row['with_copies_ms']:7.2f}ms {row['without_ms']:7.2f}ms "
              f"{row['ratio']:5.3f}x {row['copies_per_run']:6d}  {row['met']}")
    with open(options.json, "w") as f:
        json.dump({"rows": rows}, f, indent=1)
    print(f"written: {options.json}")


if __name__ == "__main__":
    main()
