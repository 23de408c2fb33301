"""A fake Apple MPS for tests: torch.mps becomes a fake device module and
torch.backends.mps says a device is there. No tensors: MPS is an in-tree device type, so
PrivateUse1 cannot stand in for it; the MPS backend's own code paths run against this."""

import sys

import torch

import fake_accelerator


def install():
    mps = fake_accelerator.build_device_module("mps")
    mps.current_allocated_memory = mps.memory_allocated
    mps.driver_allocated_memory = mps.memory_reserved
    mps.recommended_max_memory = lambda: 16 * 2**30
    mps._get_default_mps_generator = lambda: torch.default_generator
    torch.mps = mps
    sys.modules["torch.mps"] = mps
    torch.backends.mps.is_available = lambda: True
    torch.backends.mps.is_macos_or_newer = lambda major, minor: True
    torch.get_device_module.cache_clear()
    return mps
