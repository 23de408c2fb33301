"""What the shim costs, as differences and ratios against native PyTorch in the same run.

    python benchmarks/overhead.py [--json benchmarks/results-overhead.json] [--quick]

1. per call: ops cudashim does not translate, each translated call against its native CPU
   twin, and factories given a non-CUDA device. Rounds alternate a native process and a
   shimmed one (activated once, as programs are); each sample is the best of three timeit
   loops, and a row compares the best sample of each side (the least disturbed by the
   machine's noise, which on a shared VM is larger than the differences measured), with
   the medians and spread alongside.
2. a training step of examples/gpt.py under the shim against tests/ported/gpt_ported.py,
   eager and torch.compile'd, runs alternating; the step time is the median over the steps
   after the warm-up ones. The eager losses must be equal bit for bit.
3. start-up: ``python -m cudashim -c "import torch"`` against ``python -c "import torch"``, and
   ``python -c pass`` with the image hook's variables against without, runs alternating, with
   bytecode written as for installed packages;
4. paired in one process: where torch's own function is still reachable under the shim (the
   original of a patched one, or the CPU twin), the shimmed call and it take turns loop by
   loop in one activated process; the extra is the median of the per-turn differences, its
   spread their middle half, and a target inside that spread is reported as not resolved here.
"""

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import timeit

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cudashim  # noqa: E402
import cudashim.launcher  # noqa: E402

# name, target, shimmed statement, native statement (the CPU twin a hand port would run)
CALLS = [
    ("a + b", "1.00x", "a + b", "a + b"),
    # torch.abs has a dtype gap on the CPU (bool), so it is filled; add has none: untouched.
    ("torch.add(a, b) (no kernel gap)", "1.00x", "torch.add(a, b)", "torch.add(a, b)"),
    ("torch.abs(a) (gap filled, float32)", "+60 ns", "torch.abs(a)", "torch.abs(a)"),
    # where float16 is slow, the matmul family checks each call's dtype (float16 computes in float32)
    ("F.linear(x, w) (float32)", "+500 ns", "F.linear(x, w)", "F.linear(x, w)"),
    ("MLP forward + backward", "1.00x", "mlp_step()", "mlp_step()"),
    # translated calls, each against the CPU call a hand port would make
    ('torch.zeros(4, device="cuda")', "+60 ns", 'torch.zeros(4, device="cuda")', 'torch.zeros(4, device="cpu")'),
    ('t.to("cuda")', "+60 ns", 't.to("cuda")', 't.to("cpu")'),
    ("t.to(0)", "+60 ns", "t.to(0)", 't.to("cpu")'),
    ("t.cuda()", "+60 ns", "t.cuda()", "t.cpu()"),
    ('torch.device("cuda")', "+60 ns", 'torch.device("cuda")', 'torch.device("cpu")'),
    ("torch.cuda.current_device()", "+60 ns", "torch.cuda.current_device()", "torch.cpu.current_device()"),
    ("torch.cuda.device_count()", "+60 ns", "torch.cuda.device_count()", "torch.cpu.device_count()"),
    ("t.is_cuda", "+40 ns", "t.is_cuda", "t.is_cuda"),
    # Tensor.device names the side a tensor is on (one dict probe), and else asks the device
    # memory whether its storage is counted (one storage probe)
    ("t.device (t on the device)", "+60 ns", "t.device", "t.device"),
    ("a.device (a of unknown side)", "+60 ns", "a.device", "a.device"),
    # untranslated calls through a patched function
    ('torch.zeros(4, device="cpu")', "+30 ns", 'torch.zeros(4, device="cpu")', 'torch.zeros(4, device="cpu")'),
    # made like its argument: placed where that argument's device is the target's (one .device read)
    ("torch.zeros_like(a) (a of unknown side)", "+60 ns", "torch.zeros_like(a)", "torch.zeros_like(a)"),
    ("torch.zeros(4)", "+30 ns", "torch.zeros(4)", "torch.zeros(4)"),
    ('torch.empty(4, device=cpu_device)', "+30 ns", "torch.empty(4, device=cpu_device)",
     "torch.empty(4, device=cpu_device)"),
    ('h.to("cpu")', "+30 ns", 'h.to("cpu")', 'h.to("cpu")'),
    # a move between host and device: a copy, as CUDA's, against the clone a hand port would write
    ("host-to-device copy, 1 MiB: big.cuda()", "1.00x", "big.cuda()", "big.clone()"),
]
# name, target, shimmed statement, torch's own statement in the same activated process. Both
# sides reach their function the same way: a load of ``torch.abs`` costs 130-160 ns by itself
# (torch's module ``__getattr__`` keeps Python 3.11 from specializing it), natively as well.
PAIRS = [
    ("torch.abs(a), float32 (a function with a filled kernel gap, outside the gap)", 60,
     "shimmed_abs(a)", "original_abs(a)"),
    ('torch.zeros(4, device="cuda") vs torch\'s zeros(4, device="cpu")', 60,
     'shimmed_zeros(4, device="cuda")', 'original_zeros(4, device="cpu")'),
    ('t.to("cuda") vs torch\'s t.to("cpu")', 60, 't.to("cuda")', 'original_to(t, "cpu")'),
    ("t.cuda() vs torch's h.cpu()", 60, "t.cuda()", "original_cpu(h)"),
    ("torch.cuda.current_device() vs torch.cpu.current_device()", 60,
     "torch.cuda.current_device()", "torch.cpu.current_device()"),
    ("F.linear(x, w), float32 (the float16 policy's wrapper)", 500, "shimmed_linear(x, w)",
     "original_linear(x, w)"),
]
PAIR_TURNS = 41
PAIR_LOOP = 2000


def measure_pairs():
    """PAIRS in one activated process, the two sides taking turns loop by loop."""
    env = namespace()
    cudashim.activate("cpu")
    place_on_the_device(env)
    env.update(shimmed_abs=torch.abs, shimmed_zeros=torch.zeros, shimmed_linear=F.linear,
               original_abs=cudashim.get_original(torch, "abs"),
               original_zeros=cudashim.get_original(torch, "zeros"),
               original_to=cudashim.get_original(torch.Tensor, "to"),
               original_cpu=cudashim.get_original(torch.Tensor, "cpu"),
               original_linear=cudashim.get_original(F, "linear"))
    rows = []
    for name, target, shimmed, native in PAIRS:
        timers = [timeit.Timer(statement, globals=env) for statement in (shimmed, native)]
        for timer in timers:
            timer.timeit(PAIR_LOOP)                              # warm-up
        extra, own = [], []
        for _ in range(PAIR_TURNS):
            ours, theirs = (timer.timeit(PAIR_LOOP) / PAIR_LOOP * 1e9 for timer in timers)
            extra.append(ours - theirs)
            own.append(theirs)
        low, high = statistics.quantiles(extra, n=4)[0], statistics.quantiles(extra, n=4)[2]
        median = statistics.median(extra)
        met = ("unresolved (target within the spread)" if low <= target <= high
               else "yes" if median <= target else "no")
        rows.append({"what": name, "target_ns": target, "native_ns": statistics.median(own),
                     "extra_ns": median, "extra_middle_half_ns": [low, high], "met": met})
    return rows


# A ratio target counts as met within this margin (two runs of the same code differ by it).
RATIO_MARGIN = 0.02


def met(target: str, extra: float, ratio: float) -> bool:
    """Whether a row meets its target: "+N ns" / "+N ms" bound the extra, "1.00x" the ratio."""
    if target.endswith("x"):
        return ratio <= float(target[:-1]) + RATIO_MARGIN
    return extra <= float(target.split()[0])


def namespace():
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    batch = torch.randn(32, 64)

    def mlp_step():
        layer.zero_grad(set_to_none=True)
        layer(batch).sum().backward()

    return {"torch": torch, "F": F, "a": torch.randn(16), "b": torch.randn(16),
            "x": torch.randn(8, 32), "w": torch.randn(32, 32), "t": torch.randn(4),
            "cpu_device": torch.device("cpu"), "mlp_step": mlp_step, "big": torch.randn(256, 1024)}


def place_on_the_device(env):
    """In an activated process: ``t`` on the device and ``h`` on the host, each placed there by
    a move, so that a move to where it is returns it (natively, both are one host tensor)."""
    env["t"] = env["t"].cuda()
    env["h"] = env["t"].cpu()


def measure_calls(shimmed, target_seconds):
    """One process's per-call times in ns: cudashim activated once, as programs do (a
    process that activates and deactivates over and over measures slower than either)."""
    env = namespace()
    env["h"] = env["t"]
    if shimmed:
        cudashim.activate("cpu")
        place_on_the_device(env)
    times = {}
    for name, _, shim_statement, native_statement in CALLS:
        timer = timeit.Timer(shim_statement if shimmed else native_statement, globals=env)
        number, seconds = timer.autorange()
        number = max(1, int(number * target_seconds / max(seconds, 1e-9)))
        times[name] = min(timer.repeat(repeat=3, number=number)) / number * 1e9
    return times


def per_call_rows(rounds, target_seconds, workdir):
    """Rounds alternate a native and a shimmed process; each row reports the medians."""
    samples = {name: {"native": [], "shimmed": []} for name, *_ in CALLS}
    for i in range(rounds):
        for kind in ("native", "shimmed"):
            out = os.path.join(workdir, f"calls-{kind}-{i}.json")
            run([__file__, "--calls-worker", kind, "--seconds", str(target_seconds), "--json", out])
            with open(out) as f:
                for name, ns in json.load(f).items():
                    samples[name][kind].append(ns)
    rows = []
    for name, target, shimmed, native in CALLS:
        native_ns, shim_ns = (summary(samples[name][k]) for k in ("native", "shimmed"))
        extra, ratio = shim_ns["min"] - native_ns["min"], shim_ns["min"] / native_ns["min"]
        rows.append({"what": name, "target": target, "native_twin": native,
                     "native_ns": native_ns, "shimmed_ns": shim_ns,
                     "extra_ns": extra, "ratio": ratio, "met": met(target, extra, ratio),
                     "median_extra_ns": shim_ns["median"] - native_ns["median"]})
    return rows


def summary(values):
    ordered = sorted(values)
    return {"median": statistics.median(ordered), "min": ordered[0], "max": ordered[-1],
            "samples": len(ordered)}


def run(args, env=None):
    clean = {k: v for k, v in os.environ.items() if not k.startswith("CUDASHIM_") or k == "CUDASHIM_PURE_PYTHON"}
    clean.pop("PYTHONPATH", None)
    # Installed packages start from compiled bytecode, torch included; without this a
    # machine with PYTHONDONTWRITEBYTECODE set recompiles cudashim on every start (~25 ms).
    clean.pop("PYTHONDONTWRITEBYTECODE", None)
    result = subprocess.run([sys.executable, *args], cwd=ROOT, env={**clean, **(env or {})},
                            capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed:\n{result.stderr[-3000:]}")
    return result


def training_rows(runs, steps, warmup, compiled, workdir):
    # The shim's cost alone: float16 autocast as asked on both sides (what the precision policy
    # gains by default is benchmarks/precision.py's).
    programs = {"shimmed": ["-m", "cudashim", "--amp-dtype", "as-asked", "examples/gpt.py"],
                "native": ["tests/ported/gpt_ported.py"]}
    rows = []
    for compile_flag in ([False, True] if compiled else [False]):
        times = {k: [] for k in programs}
        losses = {}
        for i in range(runs):
            for kind, program in programs.items():
                out = os.path.join(workdir, f"{kind}-{i}-{compile_flag}")
                run([*program, "--steps", str(steps), "--checkpoint", out + ".pt", "--losses",
                     out + ".losses.json", "--step-times", out + ".times.json",
                     *(["--compile"] if compile_flag else [])])
                with open(out + ".times.json") as f:
                    times[kind].extend(t * 1e3 for t in json.load(f)[warmup:])
                with open(out + ".losses.json") as f:
                    losses.setdefault(kind, json.load(f))
        native_ms, shim_ms = summary(times["native"]), summary(times["shimmed"])
        ratio = shim_ms["median"] / native_ms["median"]
        rows.append({"what": "GPT training step" + (", torch.compile" if compile_flag else ", eager"),
                     "target": "1.00x", "native_ms": native_ms, "shimmed_ms": shim_ms,
                     "ratio": ratio, "met": met("1.00x", 0, ratio),
                     "losses_equal": losses["shimmed"] == losses["native"]})
    return rows


def paired_processes(runs, native_args, shimmed_args, shimmed_env=None):
    """Whole processes, a native one and a shimmed one taking turns: both sides' times, and
    the median and middle half of the per-turn differences (ms)."""
    samples = {"native": [], "shimmed": []}
    run(shimmed_args, shimmed_env)                       # writes cudashim's bytecode once
    for _ in range(runs):
        for kind, args, env in (("native", native_args, None), ("shimmed", shimmed_args, shimmed_env)):
            started = timeit.default_timer()
            run(args, env)
            samples[kind].append((timeit.default_timer() - started) * 1e3)
    native_ms, shim_ms = summary(samples["native"]), summary(samples["shimmed"])
    differences = [s - n for n, s in zip(samples["native"], samples["shimmed"])]
    quartiles = statistics.quantiles(differences, n=4) if len(differences) >= 4 else [min(differences)] * 3
    return {"native_ms": native_ms, "shimmed_ms": shim_ms,
            "extra_ms": shim_ms["median"] - native_ms["median"],
            "paired_extra_ms": statistics.median(differences),
            "paired_middle_half_ms": [quartiles[0], quartiles[2]]}


def startup_rows(runs):
    """``import torch`` under the launcher, and a Python that never imports torch started with
    the image hook's two variables (most Pythons of an image are tools of that kind)."""
    code = "import torch"
    startup = paired_processes(runs, ["-c", code], ["-m", "cudashim", "-c", code])
    hook_env = {"PYTHONPATH": str(cudashim.launcher.hook_dir()), "CUDASHIM_ACTIVATE": "1"}
    image = paired_processes(runs, ["-c", "pass"], ["-c", "pass"], hook_env)
    return [{"what": 'start-up: -c "import torch"', "target": "+20 ms", **startup,
             "met": met("+20 ms", startup["paired_extra_ms"], 0)},
            {"what": 'the image hook, a Python without torch: -c "pass"', "target": "+5 ms", **image,
             "met": met("+5 ms", image["paired_extra_ms"], 0)}]


def print_table(result):
    print(f"cudashim overhead on {result['machine']}, torch {result['torch']}")
    print("paired in one process (median extra per call, middle half of the turns):")
    for row in result["paired"]:
        low, high = row["extra_middle_half_ns"]
        print(f"  {row['what']:78s} +{row['target_ns']:.0f} ns  {row['extra_ns']:+6.0f} ns ({low:+.0f}..{high:+.0f}) "
              f"over {row['native_ns']:.0f} ns: {row['met']}")
    print(f"(implementation: {result['implementation']}; per call: best samples, median extra alongside)")
    print(f"{'what':40s} {'target':>8s} {'met':>3s} {'native':>11s} {'shimmed':>11s} {'extra':>10s} {'ratio':>6s}  "
          f"median extra, spread (shimmed)")
    for row in result["per_call"]:
        n, s = row["native_ns"], row["shimmed_ns"]
        print(f"{row['what']:40s} {row['target']:>8s} {'yes' if row['met'] else 'NO':>3s} {n['min']:8.0f} ns "
              f"{s['min']:8.0f} ns {row['extra_ns']:+7.0f} ns {row['ratio']:6.2f}  "
              f"{row['median_extra_ns']:+.0f} ns, {s['min']:.0f}-{s['max']:.0f} ns")
    for row in result["training"]:
        _print_ms_row(row, ".1f", "" if row["losses_equal"] else "  (losses differ)")
    for row in result["startup"]:
        _print_ms_row(row, ".0f", f" (median of paired differences {row['paired_extra_ms']:+.0f} ms)")


def _print_ms_row(row, digits, note):
    """A whole-step or whole-process row: medians, their difference and ratio, the range."""
    n, s = row["native_ms"], row["shimmed_ms"]
    print(f"{row['what']:40s} {row['target']:>8s} {'yes' if row['met'] else 'NO':>3s} "
          f"{n['median']:8{digits}} ms {s['median']:8{digits}} ms {s['median'] - n['median']:+7{digits}} ms "
          f"{s['median'] / n['median']:6.2f}  {s['min']:{digits}}-{s['max']:{digits}} ms{note}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results-overhead.json"))
    parser.add_argument("--quick", action="store_true", help="fewer rounds and steps (a smoke run)")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile row")
    parser.add_argument("--calls-worker", choices=("native", "shimmed", "pairs"), help=argparse.SUPPRESS)
    parser.add_argument("--seconds", type=float, default=0.05, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.calls_worker:
        with open(args.json, "w") as f:
            json.dump(measure_pairs() if args.calls_worker == "pairs"
                      else measure_calls(args.calls_worker == "shimmed", args.seconds), f)
        return
    rounds, runs, steps = (3, 1, 12) if args.quick else (7, 3, 40)
    result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
                         f"{platform.system()}", "torch": torch.__version__, "python": platform.python_version(),
              "command": "python " + " ".join(sys.argv),
              "implementation": cudashim.speedups.describe(cudashim._settings.load())}
    with tempfile.TemporaryDirectory() as workdir:
        out = os.path.join(workdir, "pairs.json")
        run([__file__, "--calls-worker", "pairs", "--json", out])
        with open(out) as f:
            result["paired"] = json.load(f)
        result["per_call"] = per_call_rows(rounds, 0.02 if args.quick else 0.05, workdir)
        result["training"] = training_rows(runs, steps, warmup=5, compiled=not args.no_compile,
                                           workdir=workdir)
    result["startup"] = startup_rows(5 if args.quick else 20)
    print_table(result)
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
