"""Lightning's CUDA accelerator works on the target: it holds CUDA devices, as on a GPU machine.

Lightning (Trainer and Fabric, in the ``lightning`` package and the standalone
``pytorch_lightning`` and ``lightning_fabric``) asks its ``CUDAAccelerator`` for the devices
it trains on, builds them with ``torch.device("cuda", i)``, and then checks
``device.type == "cuda"`` (``setup_device`` raises "Device should be CUDA, got cpu", and DDP's
communication hooks, the NCCL backend and FLOP counts are chosen by that type). Under
cudashim a device built that way is already the target's, so every such check fails.

The accelerator's devices are kept as what Lightning's own code means: real CUDA devices.
Everything Lightning then does with them goes through the surface cudashim translates
(``.to(device)``, factories, ``torch.cuda.set_device``, ``torch.autocast(device.type)``,
DDP's ``device_ids``, ``torch.load(map_location=)``), so the model, batches and
checkpoints are on the target, while Lightning, its callbacks and the program's
``self.device`` see the CUDA device a GPU machine would give them. Lightning's CPU
accelerator would be the other choice; it refuses ``precision="16-mixed"`` and changes the
defaults GPU programs were tuned with, which is not what a program written for GPUs expects.

``ddp_spawn`` sends the model to its ranks through ``mp.spawn``, which puts host tensors in
shared memory. On a GPU each rank's ``.to(cuda_device)`` makes its own copy; in host memory
(the CPU backend) it would not, and the ranks would train one set of weights together. So
there each rank unshares the modules it receives, as Lightning does for its CPU accelerator.
The devices themselves cross processes as they are (``device_objects``).

Lightning's advice to set a float32 matmul precision is printed only where that setting
changes what the target computes.
"""

from __future__ import annotations

import functools
import inspect

import torch

# Where Lightning defines its CUDA accelerator, in the unified package and the standalone ones.
CUDA_ACCELERATORS = (
    "lightning.fabric.accelerators.cuda",
    "lightning.pytorch.accelerators.cuda",
    "lightning_fabric.accelerators.cuda",
    "pytorch_lightning.accelerators.cuda",
)
# Where its spawning launchers run a rank's function, and the helper that unshares modules.
LAUNCHERS = (
    "lightning.fabric.strategies.launchers.multiprocessing",
    "lightning.pytorch.strategies.launchers.multiprocessing",
    "lightning_fabric.strategies.launchers.multiprocessing",
    "pytorch_lightning.strategies.launchers.multiprocessing",
)


def install(activation):
    real_device = torch._C.device           # torch.device before cudashim's proxy: not translated

    def cuda_devices(devices):
        """The accelerator's devices for these indices, as Lightning builds them on a GPU machine."""
        return [real_device("cuda", index) for index in devices]

    def keep_cuda_devices(module):
        accelerator = getattr(module, "CUDAAccelerator", None)
        if accelerator is not None:
            activation.registry.set_attr(accelerator, "get_parallel_devices", staticmethod(cuda_devices))
        if hasattr(module, "_check_cuda_matmul_precision"):     # each module binds its own name
            activation.replace(module, "_check_cuda_matmul_precision",
                               lambda original: _advice_where_it_applies(activation, original))

    for module_name in CUDA_ACCELERATORS:
        activation.when_imported(module_name, keep_cuda_devices)
    if activation.backend.device_type == "cpu":        # devices in host memory: .to() copies nothing
        for module_name in LAUNCHERS:
            activation.when_imported(module_name, lambda module: _unshare_in_each_rank(activation, module))


def _advice_where_it_applies(activation, original):
    """Lightning advises ``torch.set_float32_matmul_precision("high")`` on a GPU with tensor
    cores (it reads the capability, which cudashim reports as an Ampere's). The advice holds on
    the target only where that setting reaches a faster float32 matmul (the precision policy
    maps it to oneDNN's bfloat16 where the CPU computes bfloat16 fast); elsewhere it is noise."""
    @functools.wraps(original)
    def _check_cuda_matmul_precision(device):
        policy = activation.precision
        if policy is not None and policy.float32_matmul_precision is not None:
            original(device)
    return _check_cuda_matmul_precision


def _unshare_in_each_rank(activation, module):
    """A spawned rank's modules get memory of their own before the rank's function runs."""
    unshare = module._disable_module_memory_sharing
    parameters = inspect.signature(module._MultiProcessingLauncher._wrapping_function).parameters
    place = list(parameters).index("args") - 1                # without self

    def make(original):
        # A plain function, not a wrapt proxy: mp.spawn pickles the bound method by its name.
        @functools.wraps(original)
        def _wrapping_function(launcher, *args, **kwargs):
            if launcher._start_method == "spawn":
                args = list(args)
                args[place], args[place + 1] = unshare((args[place], args[place + 1]))
            return original(launcher, *args, **kwargs)
        return _wrapping_function

    activation.replace(module._MultiProcessingLauncher, "_wrapping_function", make)
