"""What every benchmark records about where it ran: the CPU, its SIMD flags, the software and
the commit, so that a table says which host and which code its figures belong to."""

import datetime
import os
import platform
import subprocess

# The CPU features that decide which kernels and dtypes run fast, as /proc/cpuinfo names them.
SIMD_FLAGS = ("sse2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512_bf16",
              "avx512_fp16", "amx_bf16", "amx_fp16", "amx_tile", "asimd", "sve", "bf16", "fphp")

# The flags that set a host's class, narrowest first: its widest vector unit and the dtypes it
# computes in hardware.
TIERS = ("sse2", "avx", "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_bf16", "asimd", "sve")

REPOSITORY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")


def _cpuinfo():
    try:
        with open("/proc/cpuinfo") as f:
            return f.read()
    except OSError:
        return ""


def cpu_model() -> str:
    for line in _cpuinfo().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "CPU part") and value.strip():
            return value.strip()
    return platform.processor() or platform.machine()


def cpu_flags() -> list:
    """The SIMD flags of SIMD_FLAGS this CPU has, in that order."""
    for line in _cpuinfo().splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            have = set(value.split())
            return [flag for flag in SIMD_FLAGS if flag in have]
    return []


def commit() -> str:
    """The checkout's commit, with "+changes" where its tracked files differ from it (but for
    the results and the page the benchmarks write themselves)."""
    def git(*args):
        return subprocess.run(["git", "-C", REPOSITORY, *args], capture_output=True, text=True)
    head = git("rev-parse", "--short", "HEAD")
    if head.returncode:
        return "unknown (not a git checkout)"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!BENCHMARKS.md",
                ":!benchmarks/results").stdout.strip()
    return head.stdout.strip() + ("+changes" if dirty else "")


def describe() -> dict:
    import torch
    return {"cpu": cpu_model(), "cpu_flags": cpu_flags(), "cpus": os.cpu_count(),
            "machine": platform.machine(), "python": platform.python_version(),
            "torch": torch.__version__, "commit": commit(),
            "date": datetime.date.today().isoformat()}


def line(info: dict) -> str:
    """One line for a table's heading."""
    return (f"{info['cpu']} ({info['cpus']} CPUs; {' '.join(info['cpu_flags']) or 'no SIMD flags read'}), "
            f"Python {info['python']}, torch {info['torch']}, at {info['commit']}, {info['date']}")


def key(info: dict) -> str:
    """The name a host's results are kept under: its CPU, the widest of its SIMD flags and its
    CPU count, which decide what the tables measure (``amd-epyc-avx512_bf16-2cpu``)."""
    model = "".join(c if c.isalnum() else "-" for c in info["cpu"].lower()).strip("-")
    while "--" in model:
        model = model.replace("--", "-")
    tiers = [flag for flag in TIERS if flag in info["cpu_flags"]]
    return f"{model}-{tiers[-1] if tiers else info['machine']}-{info['cpus']}cpu"
