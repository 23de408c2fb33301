"""The targets with device memory of their own that end-to-end tests run CUDA programs on.

- **torchvulkan** (PyPI), a real PrivateUse1 accelerator nobody here wrote, over Mesa's software
  Vulkan driver ("llvmpipe"): one device, no collective library, streams or events of its own.
- **shimdev**, cudashim's test accelerator (``--test-devices 2``): two devices whose memory the
  host cannot touch outside the device's kernels, and a collective library of its own.

Whether each runs here is asked once, in a fresh interpreter (loading a device in the test
process would rename torch's PrivateUse1 device for every test that follows), when first asked.
"""

import dataclasses
import functools
import subprocess
import sys
import warnings
from typing import Optional, Tuple

import pytest


@dataclasses.dataclass(frozen=True)
class Target:
    name: str                       # its device type
    options: Tuple[str, ...]        # what loads it under `python -m cudashim`
    devices: int                    # its real devices
    collective: str                 # what the doctor says NCCL becomes
    pins_memory: bool               # whether its pinned host memory is pinned
    bf16: bool                      # what its device module says of bfloat16 (natively)
    probe: str                      # prints 2.0 where the target computes
    hint: str                       # what it needs

    def device(self, cuda_index: int) -> str:
        """The real device a CUDA index lands on (several share one where it has fewer)."""
        return f"{self.name}:{cuda_index % self.devices}"

    @property
    def why_not(self) -> Optional[str]:
        """None where it runs here, else why not."""
        return _why_not(self.probe, self.hint)


@functools.lru_cache(maxsize=None)
def _why_not(probe: str, hint: str) -> Optional[str]:
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=900)
    if result.returncode == 0 and result.stdout.strip().splitlines()[-1:] == ["2.0"]:
        return None
    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
    return f"it cannot run here ({last}): {hint}"


VULKAN = Target(
    "vulkan", ("--device-extension", "torchvulkan"), devices=1,
    collective="NCCL becomes 'staged' (through host memory to gloo", pins_memory=False, bf16=False,
    probe="import torch, torchvulkan; print(torch.ones(2, device='vulkan').sum().item())",
    hint="pip install torchvulkan==0.2.1, and the Vulkan loader and Mesa's driver "
         "(apt install libvulkan1 mesa-vulkan-drivers)")
SHIMDEV = Target(
    "shimdev", ("--test-devices", "2"), devices=2,
    collective="NCCL becomes 'cpu:gloo,shimdev:shimccl'", pins_memory=True, bf16=True,
    # Builds the test accelerator the first time (torch's extension cache keeps it).
    probe="import torch; from cudashim import testdevice; testdevice.load(2); "
          "print(torch.ones(2, device='shimdev:1').sum().item())",
    hint="cudashim's test accelerator needs a C++ compiler and ninja")
TARGETS = (VULKAN, SHIMDEV)


def targets(*, where=lambda target: True):
    """The targets that run here (and pass ``where``); skip when none does, and name in a
    warning each that cannot."""
    chosen = [target for target in TARGETS if where(target)]
    runnable = [target for target in chosen if target.why_not is None]
    for target in chosen:
        if target.why_not is not None:
            warnings.warn(f"not run on {target.name}: {target.why_not}")
    if not runnable:
        pytest.skip("; ".join(f"{target.name}: {target.why_not}" for target in chosen))
    return runnable
