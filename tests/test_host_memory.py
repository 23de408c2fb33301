"""Host memory a program frees is kept for its next tensors on the CPU backend, as CUDA's caching
allocator keeps device memory, until torch.cuda.empty_cache(); a program's own allocator settings
stand, and deactivation gives malloc its defaults back."""

import platform

import pytest

from conftest import python

glibc_only = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="freed memory is kept by glibc's malloc only")

# The resident memory (MiB) before a 16 MiB tensor is made on the device, while it lives, once it
# is freed, and after empty_cache(). 16 MiB: over the 128 KiB from which glibc's malloc maps
# fresh pages by default, under the 32 MiB up to which blocks can be kept.
PROGRAM = """
import torch

def resident():
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * 4096 / 2 ** 20

before = resident()
tensor = torch.ones(4 * 2 ** 20, device="cuda")
held = resident()
del tensor
freed = resident()
torch.cuda.empty_cache()
print(before, held, freed, resident())
"""


def _resident(*options, env=None):
    result = python("-m", "cudashim", *options, "-c", PROGRAM, env=env)
    assert result.returncode == 0, result.stderr
    before, held, freed, emptied = map(float, result.stdout.split())
    assert held - before >= 15                           # the tensor's pages, touched
    return held - freed, held - emptied


@glibc_only
def test_freed_device_memory_stays_in_the_process_until_empty_cache():
    kept, released = _resident()
    assert kept < 2 and released >= 14


@glibc_only
@pytest.mark.parametrize("options, env", [
    (("--disable", "host_memory"), None),
    ((), {"MALLOC_TRIM_THRESHOLD_": "131072"}),          # the program's own malloc settings
])
def test_without_the_group_or_where_the_program_set_malloc_up_freed_memory_goes_back_at_once(options, env):
    kept, _ = _resident(*options, env=env)
    assert kept >= 14


@glibc_only
def test_deactivation_gives_malloc_its_thresholds_back(shim):
    """After deactivation a freed 16 MiB tensor leaves the process at once, as it did before."""
    import torch
    from cudashim import host_memory

    def resident():
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096 / 2 ** 20

    def kept_after_free():
        tensor = torch.ones(4 * 2 ** 20)
        held = resident()
        del tensor
        return held - resident()

    if host_memory.chosen_elsewhere() is not None:
        pytest.skip(f"this run's allocator settings stand: {host_memory.chosen_elsewhere()}")
    assert kept_after_free() < 2
    shim.deactivate()
    assert kept_after_free() >= 14
