"""DDP's record of used parameters needs pinned host memory on a PrivateUse1 device.

With ``find_unused_parameters=True``, and in the first iteration of a static graph, torch's
DDP reducer copies which parameters took part in backward from host memory to the device.
For CUDA and PrivateUse1 devices it stages that copy in pinned host memory and asserts that
it got some. An extension that answers a request for pinned memory with ordinary memory
(torchvulkan does) fails that assert in the middle of backward, as "INTERNAL ASSERT FAILED
... please report a bug to PyTorch". cudashim cannot give such a device pinned memory, so it
says what is missing when the model is wrapped, and what runs instead.
"""

from __future__ import annotations

import functools
import inspect

import torch

from ...errors import UnsupportedCudaAPI

# The DDP options that make the reducer track which parameters were used.
TRACKING = ("find_unused_parameters", "static_graph")


def install(activation) -> None:
    """Guard DDP where the target is the PrivateUse1 device (XPU, MPS and HPU are their own
    device types, which the reducer copies to without pinning)."""
    target = activation.backend.device_type
    if target != torch._C._get_privateuse1_backend_name():
        return
    ddp = torch.nn.parallel.DistributedDataParallel
    activation.replace(ddp, "__init__", lambda original: _refusing_untracked(original, target))
    activation.replace(ddp, "_set_static_graph", lambda original: _refusing_static_graph(original, target))


@functools.lru_cache(maxsize=None)
def _pins_host_memory(target: str) -> bool:
    """Whether host memory the target pinned is pinned (asked once per target)."""
    try:
        return torch.empty(1, pin_memory=True).is_pinned()
    except RuntimeError:
        return False


def _refusal(option: str, target: str) -> UnsupportedCudaAPI:
    return UnsupportedCudaAPI(
        f"DistributedDataParallel({option}=True)", target,
        f"torch's DDP stages its record of which parameters were used in pinned host memory, and "
        f"this {target} extension does not pin host memory; where every parameter gets a gradient, "
        f"{option}=False runs (the Hugging Face Trainer: ddp_find_unused_parameters=False)")


def _on_target(module, target: str) -> bool:
    return any(parameter.device.type == target for parameter in module.parameters())


def _refusing_untracked(original, target):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        arguments = signature.bind_partial(self, *args, **kwargs).arguments
        asked = [option for option in TRACKING if arguments.get(option)]
        if asked and _on_target(arguments["module"], target) and not _pins_host_memory(target):
            raise _refusal(asked[0], target)
        original(self, *args, **kwargs)
    return __init__


def _refusing_static_graph(original, target):
    @functools.wraps(original)
    def _set_static_graph(self):
        if _on_target(self.module, target) and not _pins_host_memory(target):
            raise _refusal("static_graph", target)
        return original(self)
    return _set_static_graph
