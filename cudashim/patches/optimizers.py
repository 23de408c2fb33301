"""Optimizers: ``capturable=True`` on the target, as a CUDA program captures a step in a graph.

CUDA programs that capture an optimizer step in a CUDA graph make it capturable
(``Adam(..., capturable=True)``): its step counters stay on the device and it reads no value on
the host. torch accepts that only on the devices its table lists (CUDA, XPU, HPU, the
PrivateUse1 device, XLA), and fails an assertion elsewhere, on the CPU and MPS among them. The
capturable path is written for any device, so the target joins the table.
"""

import importlib
import sys

import torch

TABLE = "_get_capturable_supported_devices"


def install(activation):
    optimizer = importlib.import_module("torch.optim.optimizer")     # torch.optim deletes the name
    original = getattr(optimizer, TABLE, None)
    if original is None:                        # a torch without the table checks nothing
        return
    target = activation.backend.device_type

    def joined(devices):
        return devices if target in devices else [*devices, target]

    # TorchScript compiles this too (torch.distributed.optim scripts its functional optimizers).
    # So it keeps torch's signature, and the script compiler, which cannot read a closed-over
    # string, skips the branch that adds the target (as it skips torch's own eager-only branch).
    def with_the_target(supports_xla: bool = True) -> list[str]:
        devices = original(supports_xla)
        if not torch.jit.is_scripting():
            devices = joined(devices)
        return devices

    # Each optimizer module holds the function under its own name (``from .optimizer import``).
    holders = [module for name, module in list(sys.modules.items())
               if (name == "torch.optim" or name.startswith("torch.optim.")) and module is not None
               and vars(module).get(TABLE) is original]
    for module in holders:
        activation.replace(module, TABLE, lambda _: with_the_target)
