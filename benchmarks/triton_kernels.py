"""Triton kernels written for CUDA on a target Triton has no backend for: what running them
through Triton's interpreter costs against torch's own ops (``cudashim/patches/triton``).

    python benchmarks/triton_kernels.py [--quick] [--json PATH] [--python PYTHON]

Triton comes with torch's CUDA builds, not with the CPU build the benchmarks' environment pins;
the timing program (``benchmarks/programs/triton_timing.py``) runs under cudashim in a Python that
has triton: --python, else this one where it has triton, else the torch-range environment
``.tox/torch2.14`` (``./scripts/tox -e torch2.14 --notest`` makes it), with this checkout's cudashim.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CANDIDATES = (sys.executable, os.path.join(ROOT, ".tox", "torch2.14", "bin", "python"))


def with_triton(given):
    """The first Python that imports triton, or None."""
    for python in ([given] if given else CANDIDATES):
        if os.path.exists(python) and subprocess.run([python, "-c", "import triton"],
                                                     capture_output=True).returncode == 0:
            return python
    return None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--json")
    parser.add_argument("--quick", action="store_true", help="two repeats: a smoke run")
    parser.add_argument("--python", help="a Python whose torch brings triton")
    args = parser.parse_args()
    python = with_triton(args.python)
    if python is None:            # the results file, if any, is left as it was: all.py keeps it
        print("no Python with triton here: pass --python, or make the torch-range environment "
              "(./scripts/tox -e torch2.14 --notest)")
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDASHIM_")}
    env["PYTHONPATH"] = ROOT
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "timing.json")
        subprocess.run([python, "-m", "cudashim", "benchmarks/programs/triton_timing.py", out,
                        "--repeats", "2" if args.quick else "5"], cwd=ROOT, env=env, check=True)
        with open(out) as f:
            result = json.load(f)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
