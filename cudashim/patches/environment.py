"""CUDA_VISIBLE_DEVICES becomes the vendor's variable, and NCCL's variables the target library's.

Each is set only where the user has not set the target's own variable. On the CPU the backend
reads CUDA_VISIBLE_DEVICES itself to size its virtual devices. NCCL's variables follow one table
(``_nccl_environment.TABLE``); the report says what each became.
"""

import os

from . import _nccl_environment


def install(activation):
    backend, registry = activation.backend, activation.registry
    var = backend.visible_devices_var
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if var and visible is not None and var not in os.environ:
        registry.set_item(os.environ, var, visible)

    # Every process group NCCL becomes holds gloo for host tensors, beside the target's library
    # (named without choosing it: choosing may import a vendor's bindings, or find none).
    libraries = _nccl_environment.libraries_of(activation.settings.collective or backend.default_collective)
    became = _nccl_environment.apply(os.environ, libraries, registry.set_item, activation.count)
    if any(variable == "NCCL_DEBUG" and "TORCH_DISTRIBUTED_DEBUG=" in said for variable, said in became):
        _debug_level_from_environment(registry)


def _debug_level_from_environment(registry):
    """c10d read TORCH_DISTRIBUTED_DEBUG when torch.distributed was imported: read it again."""
    import torch.distributed as dist
    if not dist.is_available():
        return
    previous = dist.get_debug_level()
    dist.set_debug_level_from_env()
    registry.add_undo("c10d's debug level", lambda: dist.set_debug_level(previous))
