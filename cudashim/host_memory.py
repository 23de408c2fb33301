"""Host memory a program frees, kept for its next tensors where device memory is host memory (the
CPU backend), as CUDA's caching allocator keeps device memory.

torch's CPU allocator hands each tensor to the C library's malloc and back. glibc's malloc serves
a block of 128 KiB or more (a threshold it raises, up to 32 MiB, as such blocks are freed) with
pages fresh from the kernel, and gives freed memory at the top of its heap back to the kernel
once more than twice that threshold is free there: the next tensor of that size faults its
pages in again, each one zeroed by the kernel. A CUDA program frees and makes its activations at
every layer, and CUDA's caching allocator hands it the same memory again. On a 2-core AMD EPYC
virtual machine a float16 convnet's batch (benchmarks/programs/half_inference.py) took 28-36 ms
under cudashim with malloc's defaults and 24-26 ms with freed blocks kept; its bfloat16 port,
native, 18-28 ms and 18-21 ms.

``keep_freed`` (the ``host_memory`` patch group, at activation) sets malloc's thresholds so that
freed blocks of up to 32 MiB (the largest threshold glibc takes) stay in the process;
``torch.cuda.empty_cache()`` gives them back (``malloc_trim``), as CUDA's gives its cached blocks
back to the driver. Deactivation sets glibc's default thresholds again; its threshold then stays
where it is set (glibc has no call that restores the raising). A program that chose its
allocator (``LD_PRELOAD`` of jemalloc, tcmalloc or mimalloc) or glibc's malloc settings (the
``MALLOC_*_`` variables, ``GLIBC_TUNABLES``) keeps its choice, and a C library other than glibc
is left as it is.
"""

from __future__ import annotations

import ctypes
import os
from typing import Optional

# mallopt's parameters (glibc's malloc.h) and their defaults
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_DEFAULT_THRESHOLD = 128 * 1024
# The largest mmap threshold glibc takes on a 64-bit system (DEFAULT_MMAP_THRESHOLD_MAX)
_LARGEST_MMAP_THRESHOLD = 32 * 1024 * 1024
_NEVER_TRIM = 2 ** 31 - 1                 # mallopt's value is a C int
_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")
_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_", "MALLOC_MMAP_MAX_")

_kept = False


def _glibc():
    """The running C library where it is glibc, else None."""
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version         # glibc's own: musl and others have no mallopt thresholds
        return libc
    except (OSError, AttributeError, TypeError):    # TypeError: no process handle (Windows)
        return None


def chosen_elsewhere() -> Optional[str]:
    """What the program chose for its allocator, or None."""
    preloaded = os.environ.get("LD_PRELOAD", "")
    for allocator in _ALLOCATORS:
        if allocator in preloaded:
            return f"LD_PRELOAD names {allocator}"
    for name in _SETTINGS:
        if name in os.environ:
            return f"{name} is set"
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        return "GLIBC_TUNABLES sets glibc.malloc"
    return None


def keep_freed() -> Optional[str]:
    """Keep freed blocks of up to 32 MiB in the process; None once they are, else why not."""
    global _kept
    why_not = chosen_elsewhere()
    if why_not is not None:
        return f"the program's allocator settings stand ({why_not})"
    libc = _glibc()
    if libc is None:
        return "the C library is not glibc"
    if not (libc.mallopt(_M_MMAP_THRESHOLD, _LARGEST_MMAP_THRESHOLD) and libc.mallopt(_M_TRIM_THRESHOLD, _NEVER_TRIM)):
        restore()
        return "glibc's malloc refused the thresholds"
    _kept = True
    return None


def restore() -> None:
    """glibc's default thresholds again, and the blocks kept given back."""
    global _kept
    libc = _glibc()
    if libc is None:
        return
    libc.mallopt(_M_MMAP_THRESHOLD, _DEFAULT_THRESHOLD)
    libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_THRESHOLD)
    if _kept:
        libc.malloc_trim(0)
    _kept = False


def release() -> None:
    """Give the freed blocks kept back to the kernel (``torch.cuda.empty_cache()``)."""
    if _kept:
        _glibc().malloc_trim(0)
