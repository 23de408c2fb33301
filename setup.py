"""The compiled fast paths, built where a C compiler is found.

Everything else is declared in pyproject.toml, but for the package list: every package under
cudashim/, found, so a new folder ships without a list to keep, and the hook's folder. Both extensions are optional: where the build
fails (no compiler, no Python headers; the host kernels also need GCC or Clang) pip installs the package without them, and cudashim
runs its pure-Python fallbacks, which behave the same (``cudashim doctor`` says which runs).
"""

import sys

from setuptools import Extension, find_packages, setup

COMPILE_ARGS = ["-O3"]
# The host kernels give the same bits in every instruction-set variant: no fused multiply-adds
# where the source writes a multiply and an add.
KERNEL_ARGS = ["-ffp-contract=off"]
# The host kernels split their loops over threads (pthreads, part of libc on recent glibc).
THREAD_ARGS = [] if sys.platform == "win32" else ["-pthread"]

setup(packages=find_packages(include=["cudashim", "cudashim.*"]) + ["cudashim._sitecustomize"], ext_modules=[
    Extension("cudashim._speedups",
              ["cudashim/_speedups.c", "cudashim/_speedups_callers.c", "cudashim/_speedups_devices.c",
               "cudashim/_speedups_gaps.c", "cudashim/_speedups_precision.c", "cudashim/_speedups_at_once.c",
               "cudashim/_speedups_memory.c", "cudashim/_speedups_residency.c",
               "cudashim/_speedups_reductions.c"],
              depends=["cudashim/_speedups.h"], extra_compile_args=COMPILE_ARGS, optional=True),
    Extension("cudashim.kernels._native", ["cudashim/kernels/_native.c"],
              depends=["cudashim/kernels/_native_loops.h"],
              extra_compile_args=COMPILE_ARGS + KERNEL_ARGS + THREAD_ARGS, extra_link_args=THREAD_ARGS,
              optional=True),
])
