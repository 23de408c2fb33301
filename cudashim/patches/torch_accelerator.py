"""``torch.accelerator``'s device arguments: "cuda" names the target.

Where the target is an accelerator torch knows (XPU, NPU, HPU, MPS), the device argument is
translated and torch answers. The CPU is no accelerator to ``torch.accelerator``: every call
that names a device fails there ("Accelerator expected"). On the CPU target, a call that names
the program's device (CUDA, or the CPU device its ``torch.device("cuda")`` became) gets the
answer of its ``torch.cuda`` counterpart instead, as the proxy gives it.

On the CPU, the program also sees through ``torch.accelerator`` the machine ``torch.cuda``
shows it (one consistent machine): ``current_accelerator()`` is the target device,
``is_available()`` and ``device_count()`` agree with ``torch.cuda``, and calls naming no
device answer for the current one. torch and the libraries that load CUDA code hear the
truth (``callers``): no accelerator.
"""

import functools
import inspect
import sys

import torch

from .. import torch_names
from ..patching import by_caller
from ..patching.by_caller import ByCaller
from ..patching.rewriter import DEVICE, apply, rewrite

# torch.accelerator function -> its torch.cuda counterpart. Each takes one device (or index)
# as its first, positional-only argument.
COUNTERPARTS = {
    "synchronize": "synchronize",
    "current_stream": "current_stream",
    "set_device_index": "set_device",
    "set_device_idx": "set_device",
    "get_device_capability": None,           # a dict of supported dtypes: see below
    "memory_stats": "memory_stats",
    "memory_allocated": "memory_allocated",
    "max_memory_allocated": "max_memory_allocated",
    "memory_reserved": "memory_reserved",
    "max_memory_reserved": "max_memory_reserved",
    "reset_accumulated_memory_stats": "reset_accumulated_memory_stats",
    "reset_peak_memory_stats": "reset_peak_memory_stats",
    "get_memory_info": "mem_get_info",
}


# On an accelerator, install() applies these; on the CPU it answers the calls itself.
# ``device_index(i)`` takes an index only, which means the same on every accelerator: it
# needs no translation, and on the CPU it is answered below.
# torch.accelerator came with torch 2.6: before it no program calls it, and nothing is patched.
_ACCELERATOR = torch_names.get("torch.accelerator", None)
DEVICE_ARGUMENTS = tuple(
    rewrite(f"torch.accelerator:{name}", DEVICE, position=0,
            parameter=next(iter(inspect.signature(getattr(_ACCELERATOR, name)).parameters)))
    for name in COUNTERPARTS if hasattr(_ACCELERATOR, name))
TRANSLATES = tuple((d.target, d.arguments[0].parameter) for d in DEVICE_ARGUMENTS)


def install(activation):
    """An accelerator: translate. The CPU: a call naming the target (or, from the program,
    naming none) goes to ``torch.cuda``."""
    if _ACCELERATOR is None:
        return
    # The target's own accelerator, not the one a build was compiled for: a CUDA build of torch
    # on a machine without a GPU reports CUDA, and its target is the CPU.
    accelerator = torch.accelerator.current_accelerator()
    if accelerator is not None and accelerator.type == activation.backend.device_type:
        for declaration in DEVICE_ARGUMENTS:
            apply(activation, declaration)
        return
    translate, real_device = activation.translator.translate, torch._C.device
    hears_truth = activation.callers.hears_truth

    def names_target(device) -> bool:
        """Whether ``device`` means the target: a CUDA spec, an index (a CUDA index in a CUDA
        program's vocabulary), or a CPU device (what the program's ``torch.device("cuda")``
        became). Natively every one of them fails here: there is no accelerator."""
        if device is None:
            return not hears_truth(3)          # the caller of the torch.accelerator function
        if device.__class__ is bool:
            return False
        if device.__class__ is int:
            return True
        target = translate(device)
        if target.__class__ is not real_device:
            try:
                target = real_device(target)
            except (RuntimeError, TypeError):
                return False                     # torch's own error, from the original
        return target.type == "cpu"

    for name, counterpart in COUNTERPARTS.items():
        if hasattr(torch.accelerator, name):
            activation.replace(torch.accelerator, name,
                               lambda original, c=counterpart: _answered_by_cuda(original, c, names_target))
    activation.replace(torch.accelerator, "device_index",
                       lambda original: _device_index(original, names_target))
    _one_machine(activation)


def _cuda():
    return sys.modules["torch.cuda"]             # the proxy, once it is in


# ``current_accelerator``, ``is_available``, ``device_count`` and the current index, as
# ``torch.cuda`` answers them, for everyone but the honest.
ONE_MACHINE = tuple(ByCaller(f"torch.accelerator:{name}", answer, optional=True) for name, answer in {
    "current_accelerator": lambda activation, original: (
        lambda check_available=False, target=torch._C.device(activation.backend.device_type): target),
    "is_available": lambda activation, original: lambda: _cuda().is_available(),
    "device_count": lambda activation, original: lambda: _cuda().device_count(),
    "current_device_index": lambda activation, original: lambda: _cuda().current_device(),
    "current_device_idx": lambda activation, original: lambda: _cuda().current_device(),
}.items())


def _one_machine(activation):
    for declaration in ONE_MACHINE:
        by_caller.apply(activation, declaration)


def _answered_by_cuda(original, counterpart, names_target):
    @functools.wraps(original, updated=())
    def accelerator_call(device=None, /):
        if not names_target(device):
            return original(device)
        if counterpart is None:
            return {"supported_dtypes": _all_dtypes()}
        return getattr(sys.modules["torch.cuda"], counterpart)(device)
    return accelerator_call


def _device_index(original, names_target):
    """``with torch.accelerator.device_index(i)``: the proxy's ``torch.cuda.device(i)``."""
    @functools.wraps(original, updated=())
    def device_index(device, /):
        if names_target(device):
            return sys.modules["torch.cuda"].device(device)
        return original(device)
    return device_index


@functools.lru_cache(maxsize=None)
def _all_dtypes():
    """The CPU allocates and converts every dtype torch has."""
    return frozenset(value for value in vars(torch).values() if isinstance(value, torch.dtype))
