"""torch.device, torch.Generator, set_default_device, get_device_module and RNG forks."""

import functools
import sys

import torch

from ..patching.class_proxy import class_proxy
from ..patching.rewriter import DEVICE, DEVICE_TYPE, rewrite

REWRITES = (
    rewrite("torch:set_default_device", DEVICE),
    # fork_rng() forks CUDA's generators when no accelerator is found: the target's, here.
    rewrite("torch.random:fork_rng", DEVICE_TYPE, parameter="device_type", missing="cuda"),
    rewrite("torch.utils.checkpoint:set_device_states", DEVICE_TYPE, parameter="device_type"),
    rewrite("torch.utils.checkpoint:DefaultDeviceType.set_device_type", DEVICE_TYPE),
)
# The parameters install() translates.
TRANSLATES = (("torch:Generator", "device"), ("torch:get_device_module", "device"))


def install(activation):
    real_device = torch.device
    translate = activation.translator.for_api("torch.device")
    device_named = activation.translator.device_named_for("torch.device")

    def construct_device(*args, **kwargs):
        if len(args) == 1 and not kwargs:
            spec = args[0]
            if spec.__class__ is str:
                return device_named(spec)
            if spec.__class__ is int:
                return translate(spec)              # torch.device(0): a CUDA index
        return translate(real_device(*args, **kwargs))

    # Compiled: torch.device("cuda") is one dict lookup, without a Python frame.
    named = getattr(device_named, "named", None)
    call = None if activation.compiled is None or named is None else \
        activation.compiled.NamedDevice(named, construct_device)
    activation.registry.set_attr(torch, "device", class_proxy(real_device, construct_device, call))

    real_generator = torch.Generator
    translate_generator = activation.translator.for_api("torch.Generator")

    def construct_generator(device="cpu"):
        return real_generator(device=translate_generator(device))

    activation.registry.set_attr(torch, "Generator", class_proxy(real_generator, construct_generator))

    target_type = activation.backend.device_type
    asked_by_torch = activation.callers.asked_by_torch

    def make_get_device_module(original):
        def get_device_module(device=None):
            if device is not None and _names_cuda(real_device, device):
                # torch names CUDA only when acting on the program's devices (fork_rng's
                # fallback, say): it gets the target's module, which answers torch.cuda's
                # names for the target (the 'device_module' group); the program gets the proxy.
                # torch.accelerator names the accelerator a CUDA build was compiled for, not the
                # program's: it gets torch.cuda, which tells torch the truth (no GPU here).
                if sys._getframe(1).f_globals.get("__name__") == "torch.accelerator":
                    return torch.cuda
                return original(target_type) if asked_by_torch() else torch.cuda
            return original(device)
        return functools.wraps(original)(get_device_module)

    activation.replace(torch, "get_device_module", make_get_device_module)
    _devices_cross_processes_as_they_are(activation, real_device)


def _devices_cross_processes_as_they_are(activation, real_device):
    """A device sent to another process (``mp.spawn``'s arguments, queues) arrives as the
    device it was. torch pickles it as a call to ``torch.device``, which in a child under
    cudashim would translate a CUDA device that a framework holds on purpose (Lightning's
    ``ddp_spawn`` strategy) to the target's. Only multiprocessing's pickler is told: what
    ``torch.save`` writes stays plain torch."""
    from multiprocessing.reduction import ForkingPickler

    reducers = ForkingPickler._extra_reducers
    before = reducers.get(real_device)
    ForkingPickler.register(real_device, _reduce_device)

    def unregister():
        if before is None:
            reducers.pop(real_device, None)
        else:
            reducers[real_device] = before
    activation.registry.add_undo("devices sent to other processes", unregister)


def _reduce_device(device):
    return device_as_sent, (device.type,) if device.index is None else (device.type, device.index)


def device_as_sent(*args):
    """The device another process sent, untranslated (``torch._C.device`` is torch's own)."""
    return torch._C.device(*args)


def _names_cuda(real_device, device) -> bool:
    if device.__class__ is real_device:
        return device.type == "cuda"
    if isinstance(device, str):
        try:
            return real_device(device).type == "cuda"
        except RuntimeError:
            return False
    return False
