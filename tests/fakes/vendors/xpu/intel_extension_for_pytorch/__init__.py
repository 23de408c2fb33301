"""A stand-in for intel_extension_for_pytorch in tests.

On a torch whose own torch.xpu finds no device, the real package brings the XPU runtime.
This one makes torch.xpu a fake device module (no tensors: XPU is an in-tree device type,
so PrivateUse1 cannot stand in for it), enough for the backend's own code paths.
"""

import sys

import torch

import fake_accelerator

xpu = fake_accelerator.build_device_module("xpu")
torch.xpu = xpu
sys.modules["torch.xpu"] = xpu
torch.get_device_module.cache_clear()
