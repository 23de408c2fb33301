"""Does ``cudashim scan``'s verdict match what happens when the program runs under cudashim?

    python benchmarks/scan_agreement.py DIR [--manifest corpus.toml] [--backend auto]
                                            [--json benchmarks/results-scan-agreement.json]

Each program is scanned (``cudashim scan --json``, as a user or a CI gate runs it, from the
environment running this script) and then
run under cudashim (``python -m cudashim``) on a tiny configuration; the table gives, per
program, scan's verdict (``passes``: exit 0; ``blocks``: exit 1), the run's outcome, and
whether the two agree. Scan agrees when it passes a program that does not fail on a CUDA API,
or blocks one that does. A failure is "on a CUDA API" when the exception that ended the run
(a rank's own, under a launcher) names CUDA: the error torch or cudashim raises for a CUDA API
or device the target cannot give. Other failures are shown with their exception.

Without a manifest, every ``*.py`` file directly in DIR is a program, run with no arguments.
With one (``benchmarks/scan_corpus.toml`` is ours: public programs at pinned commits), DIR
holds one checkout per repository, named ``owner+name``, and each ``[[program]]`` says:

    name = "nanoGPT train.py"          # what the table shows
    repo = "karpathy/nanoGPT"          # DIR/karpathy+nanoGPT, at ``commit`` when it is a clone
    commit = "..."
    script = "train.py"                # the program, relative to the checkout
    cwd = "."                          # where it runs (default: the script's folder)
    args = ["--max_iters=2"]           # a tiny configuration of the program's own options
    cudashim = ["--device-count", "2"] # options of ``python -m cudashim``
    launcher = ["torchrun", "--nproc-per-node", "2"]   # runs ``LAUNCHER -m cudashim ...``
    setup = ["python -c '...'"]        # shell commands that make its input data, in cwd
    needs = ["hydra"]                  # modules it imports; a program without them is skipped
    timeout = 300

The programs are never copied into this repository; the manifest names where they are.
"""

import argparse
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import time
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from cudashim.scan.findings import BLOCKERS  # noqa: E402  (the classes scan's exit status counts)
# The last line of a traceback: the exception that ended the run.
_EXCEPTION = re.compile(r"^([A-Za-z_][\w.]*(?:Error|Exception|Interrupt|Exit|API))\b:?(.*)$", re.M)
# What launchers wrap a rank's own exception in, and the prefix torchrun puts on a rank's lines.
_WRAPPERS = {"torch.distributed.elastic.multiprocessing.errors.ChildFailedError",
             "torch.multiprocessing.spawn.ProcessRaisedException",
             "torch.multiprocessing.spawn.ProcessExitedException", "SystemExit"}
_RANK_PREFIX = re.compile(r"^\[(?:rank|default)\d+\]:", re.M)
_CUDA_FAILURE = re.compile(r"cuda|nccl|cudnn|nvml|UnsupportedCudaAPI|AcceleratorError|"
                           r"device ordinal", re.I)


def programs_of(directory: Path, manifest):
    if manifest is None:
        return [{"name": path.name, "script": str(path), "args": []}
                for path in sorted(directory.glob("*.py"))]
    entries = tomllib.loads(Path(manifest).read_text())["program"]
    for entry in entries:
        checkout = directory / entry["repo"].replace("/", "+")
        entry["script"] = str(checkout / entry["script"])
        entry["checkout"] = checkout
        if "cwd" in entry:
            entry["cwd"] = str(checkout / entry["cwd"])
    return entries


def checked_out(entry) -> str:
    """'' when the checkout is there (moved to the pinned commit if it is a clone), else why not."""
    checkout = entry.get("checkout")
    if checkout is None:
        return ""
    if not checkout.is_dir():
        return f"no checkout at {checkout} (git clone https://github.com/{entry['repo']} {checkout})"
    if (checkout / ".git").exists() and entry.get("commit"):
        moved = subprocess.run(["git", "-C", str(checkout), "checkout", "-q", entry["commit"]],
                               capture_output=True, text=True)
        if moved.returncode:
            return f"cannot check out {entry['commit']}: {moved.stderr.strip()[:200]}"
    return ""


def scan_verdict(entry, backend: str):
    found = subprocess.run([str(Path(sys.executable).with_name("cudashim")), "scan", "--backend", backend,
                            "--json", entry["script"], *entry.get("scan_options", [])],
                           capture_output=True, text=True, cwd=_cwd(entry),
                           env={**os.environ, **entry.get("env", {})})
    report = json.loads(found.stdout) if found.stdout.strip().startswith("{") else {}
    blockers = [f"{f['path']}:{f['line']} {f['kind']}" for f in report.get("findings", [])
                if f["kind"] in BLOCKERS]
    verdict = {0: "passes", 1: "blocks"}.get(found.returncode, f"error {found.returncode}")
    return verdict, blockers


def run_outcome(entry, environment):
    cwd = _cwd(entry)
    environment = {**environment, **entry.get("env", {})}
    for command in entry.get("setup", []):
        made = subprocess.run(command, shell=True, cwd=cwd, env=environment,
                              capture_output=True, text=True, timeout=entry.get("timeout", 300))
        if made.returncode:
            return "set-up failed", (made.stderr or made.stdout).strip().splitlines()[-1:]
    command = [*entry.get("launcher", [sys.executable]), "-m", "cudashim",
               *entry.get("cudashim", []), entry["script"], *entry.get("args", [])]
    if entry.get("launcher"):
        command[0] = str(Path(sys.executable).with_name(command[0]))
    try:
        ran = subprocess.run(command, cwd=cwd, env=environment, capture_output=True, text=True,
                             timeout=entry.get("timeout", 300), stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return "timed out", []
    if ran.returncode == 0:
        return "runs", []
    output = _RANK_PREFIX.sub("", ran.stderr)
    ended = [(name, text) for name, text in _EXCEPTION.findall(output) if name not in _WRAPPERS]
    last = f"{ended[-1][0]}:{ended[-1][1]}".strip() if ended else \
        (output.strip().splitlines() or [f"exit {ran.returncode}"])[-1]
    return ("fails on a CUDA API" if _CUDA_FAILURE.search(last) else "fails elsewhere"), [last[:200]]


def _cwd(entry) -> str:
    return entry.get("cwd") or str(Path(entry["script"]).parent)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path)
    parser.add_argument("--manifest", default=None)
    parser.add_argument("--backend", default="auto")
    parser.add_argument("--only", default=None, help="run the programs whose name has this text")
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results-scan-agreement.json"))
    args = parser.parse_args()

    environment = {**os.environ, "PYTHONWARNINGS": "ignore", "CUDASHIM_BACKEND": args.backend,
                   # set-up commands say "python": the interpreter running this script
                   "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    rows = []
    for entry in programs_of(args.directory.resolve(), args.manifest):
        if args.only and args.only not in entry["name"]:
            continue
        missing = [m for m in entry.get("needs", []) if importlib.util.find_spec(m) is None]
        why_not = checked_out(entry) or (f"needs {', '.join(missing)}" if missing else "")
        if why_not:
            rows.append({"program": entry["name"], "skipped": why_not})
            print(f"{entry['name']}: skipped ({why_not})", flush=True)
            continue
        started = time.perf_counter()
        verdict, blockers = scan_verdict(entry, args.backend)
        outcome, detail = run_outcome(entry, environment)
        # Scan's claim is about CUDA: a program it passes must not fail on a CUDA API, one it
        # blocks must. A failure elsewhere (a checkpoint torch.load refuses) is shown, and
        # agrees with a pass. A scan that could not give a verdict disagrees.
        on_cuda = outcome == "fails on a CUDA API"
        agree = verdict in ("passes", "blocks") and (verdict == "blocks") == on_cuda
        rows.append({"program": entry["name"], "verdict": verdict, "outcome": outcome,
                     "agree": agree, "blockers": blockers, "detail": detail,
                     "seconds": round(time.perf_counter() - started, 1)})
        print(f"{entry['name']}: {verdict} / {outcome}{'' if agree else '  DISAGREE'} "
              f"{blockers[:3]} {detail}", flush=True)

    judged = [row for row in rows if "agree" in row]
    agreeing = sum(row["agree"] for row in judged)
    missed = [row["program"] for row in judged
              if row["verdict"] == "passes" and row["outcome"] == "fails on a CUDA API"]
    width = max((len(row["program"]) for row in rows), default=10)
    print(f"\n{'program':<{width}}  {'verdict':<8}  {'outcome':<20}  agree")
    for row in rows:
        if "agree" in row:
            print(f"{row['program']:<{width}}  {row['verdict']:<8}  {row['outcome']:<20}  "
                  f"{'yes' if row['agree'] else 'NO'}")
        else:
            print(f"{row['program']:<{width}}  skipped: {row['skipped']}")
    share = agreeing / len(judged) if judged else 0.0
    print(f"\nagreement: {agreeing}/{len(judged)} ({share:.0%}); passed by scan but failed on a "
          f"CUDA API: {len(missed)} {missed if missed else ''}")
    Path(args.json).write_text(json.dumps({
        "host": platform.node(), "python": platform.python_version(),
        "torch": __import__("torch").__version__, "backend": args.backend,
        "agreement": share, "agreeing": agreeing, "judged": len(judged),
        "passed_but_failed_on_cuda": missed, "programs": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
