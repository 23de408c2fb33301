"""The compiled fast paths, built where a C compiler is found.

Everything else is declared in pyproject.toml. Both extensions are optional: where the build
fails (no compiler, no Python headers) pip installs the package without them, and cudashim
runs its pure-Python fallbacks, which behave the same (``cudashim doctor`` says which runs).
"""

from setuptools import Extension, setup

COMPILE_ARGS = ["-O3"]

setup(ext_modules=[
    Extension("cudashim._speedups", ["cudashim/_speedups.c"], extra_compile_args=COMPILE_ARGS,
              optional=True),
    Extension("cudashim.kernels._native", ["cudashim/kernels/_native.c"],
              extra_compile_args=COMPILE_ARGS, optional=True),
])
