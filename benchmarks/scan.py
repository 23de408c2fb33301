"""How long ``cudashim scan`` takes on a repository of 1,000 Python files.

    python benchmarks/scan.py [--files 1000] [--repeats 3] [--json benchmarks/results-scan.json]

The repository is generated: copies of the test tree written the way CUDA programs are
written (``tests/scan_tree``: a training loop, DDP set-up, telemetry, triton and extension
kernels, data code with no CUDA) in nested packages, each copy importing the next, so the
scan parses every file and follows local imports. Two figures, best of the repeats: the
command as a user runs it (a fresh interpreter, ``cudashim scan --json``, start-up and the
torch import included), and the scan itself in a warm process.
"""

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
TREE = ROOT / "tests" / "scan_tree"


def generate(destination: Path, files: int) -> int:
    """Write about ``files`` Python files under ``destination``; return how many."""
    sources = sorted(TREE.rglob("*.py"))
    written, copy = 0, 0
    while written < files:
        package = destination / f"group{copy // 10}" / f"project{copy}"
        for source in sources:
            target = package / source.relative_to(TREE)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(source.read_text() + f"\n\nimport data  # copy {copy}\n")
            written += 1
            if written == files:
                break
        copy += 1
    return written


def best_of(repeats, function):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return min(times), result


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", default=str(ROOT / "benchmarks" / "results-scan.json"))
    args = parser.parse_args()

    from cudashim.scan import scan

    with tempfile.TemporaryDirectory() as folder:
        count = generate(Path(folder), args.files)
        command = [sys.executable, "-c", "from cudashim.cli import main; main()", "scan",
                   "--json", "--backend", "cpu", folder]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        cold, completed = best_of(args.repeats, lambda: subprocess.run(
            command, capture_output=True, text=True, env=env))
        report = json.loads(completed.stdout)
        scan([folder], backend="cpu")                         # the runtime's tables, once
        warm, result = best_of(args.repeats, lambda: scan([folder], backend="cpu"))

    rows = [("command, fresh interpreter", cold), ("scan() in a warm process", warm)]
    print(f"cudashim scan on {count} generated files "
          f"({report['files_scanned']} scanned, {len(result.findings)} findings), "
          f"best of {args.repeats}:")
    print(f"  {'':<28}{'seconds':>9}{'files/s':>10}")
    for name, seconds in rows:
        print(f"  {name:<28}{seconds:>9.2f}{count / seconds:>10.0f}")
    with open(args.json, "w") as out:
        json.dump({"files": count, "findings": len(result.findings),
                   "command_seconds": cold, "warm_scan_seconds": warm,
                   "machine": platform.platform(), "python": platform.python_version(),
                   "cpus": os.cpu_count()}, out, indent=2)
        out.write("\n")


if __name__ == "__main__":
    main()
