"""Which reduced-precision dtypes this CPU computes fast.

On x86 the instruction set decides, and torch reports it: bfloat16 matmuls are fast with
AVX512_BF16 or AMX, float16 ones with AMX-FP16 or AVX512-FP16; without them oneDNN and
torch's own kernels convert element by element, tens of times slower than float32. Elsewhere
(Arm, with or without its BF16 and FP16 extensions, which torch does not report) a short
calibration decides: one small matmul per dtype against float32. It runs once per machine
and torch version, when a policy first asks (never at import), and is cached where the user's
caches live (``$XDG_CACHE_HOME/cudashim``, else ``~/.cache/cudashim``).
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
import time
from pathlib import Path
from typing import Dict, Tuple

import torch

log = logging.getLogger(__name__)

_X86 = ("x86_64", "amd64", "i386", "i686")
_CALIBRATION_SIZE = 192
_FAST_WITHIN = 1.25          # a dtype at most this much slower than float32 is fast


@functools.lru_cache(maxsize=None)
def speeds() -> Tuple[Dict[torch.dtype, bool], str]:
    """({float16: fast?, bfloat16: fast?}, how that is known)."""
    if platform.machine().lower() in _X86:
        return _from_instruction_set(), "from the CPU's instruction set"
    return _calibrated()


def _from_instruction_set() -> Dict[torch.dtype, bool]:
    cpu = torch.cpu
    bfloat16 = cpu._is_avx512_bf16_supported() or cpu._is_amx_tile_supported()
    float16 = cpu._is_amx_fp16_supported() or "avx512_fp16" in _cpu_flags()
    return {torch.float16: bool(float16), torch.bfloat16: bool(bfloat16)}


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return ""


def cache_file() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root, "cudashim", "cpu-dtype-speed.json")


def _calibrated() -> Tuple[Dict[torch.dtype, bool], str]:
    key = f"{platform.machine()} {platform.processor()} {os.cpu_count()} cpus, torch {torch.__version__}"
    path = cache_file()
    try:
        cached = json.loads(path.read_text()).get(key)
    except (OSError, ValueError):
        cached = None
    if cached is None:
        cached = _measure()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            table = json.loads(path.read_text()) if path.exists() else {}
            table[key] = cached
            temporary = path.with_suffix(f".{os.getpid()}.tmp")
            temporary.write_text(json.dumps(table, indent=1))
            temporary.replace(path)                   # atomic: no reader sees half a file
        except (OSError, ValueError) as exc:
            log.debug("cudashim: the dtype calibration is not cached (%s)", exc)
    return ({torch.float16: cached["float16"], torch.bfloat16: cached["bfloat16"]},
            f"calibrated on this machine (cached in {path})")


def _measure() -> Dict[str, bool]:
    """Time one small matmul per dtype; fast is at most ``_FAST_WITHIN`` times float32's time."""
    def best(dtype):
        a = torch.randn(_CALIBRATION_SIZE, _CALIBRATION_SIZE).to(dtype)
        times = []
        for _ in range(4):
            start = time.perf_counter()
            a @ a
            times.append(time.perf_counter() - start)
        return min(times[1:])                         # the first call warms the kernel up
    float32 = best(torch.float32)
    return {name: best(getattr(torch, name)) <= _FAST_WITHIN * float32
            for name in ("float16", "bfloat16")}
