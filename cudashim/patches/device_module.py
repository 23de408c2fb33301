"""The target's device module answers the ``torch.cuda`` names it lacks.

Programs dispatch on a device's type: ``getattr(torch, device.type)`` or
``torch.get_device_module(device)``, then ``is_bf16_supported()``, ``empty_cache()``,
``manual_seed_all()``. Their devices are the target's, so they reach ``torch.cpu`` (or
``torch.npu``, ``torch.xpu``), which lacks most of that API. While cudashim is active, the
target's module is given every public ``torch.cuda`` name it does not have, answered as the
proxy ``torch.cuda`` answers it; nothing it has is replaced, and deactivation takes the
additions away again.

The additions answer everyone alike. Unlike ``torch.cuda``'s names, whose callers from torch
hear the real CUDA runtime, a name asked of the target's module is about the target, whoever
asks (torch's ``fork_rng`` asks ``torch.cpu.get_rng_state`` for the program's devices).
"""

import logging
import sys
import types

import torch

from ..backends.base import vendor_lookup
from ..proxy.module import is_proxy

log = logging.getLogger(__name__)


def install(activation):
    proxy = sys.modules.get("torch.cuda")
    if not is_proxy(proxy):
        log.debug("cudashim: torch.cuda is not the proxy; the target's device module is left as is")
        return
    target = target_module(activation.backend)
    if target is None or target is proxy:
        return
    for name, value in vars(proxy).items():
        if name.startswith("_") or answers(target, name):
            continue
        activation.registry.add_attr(target, name, getattr(value, "cudashim_answer", value))


def answers(module, name: str) -> bool:
    """Whether the module has ``name``: an attribute, or a name its own ``__getattr__`` makes
    (torchvulkan makes ``default_generators`` there, its devices' generators)."""
    return name in vars(module) or vendor_lookup(module, name) is not None


def target_module(backend):
    """The module ``getattr(torch, <target device type>)``, or None where torch has none."""
    module = getattr(torch, backend.device_type, None)
    return module if isinstance(module, types.ModuleType) else None
