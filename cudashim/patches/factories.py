"""Every tensor constructor that takes ``device=`` (and ``pin_memory=``).

The list is torch's own (``torch.utils._device._device_constructors()``, the table torch
uses for ``with torch.device(...)``) plus the ``*_like`` functions and ``torch.normal``, and
the few other functions that build tensors on a device (``from_file``, flex attention's
block masks, ``from_dlpack``). Where the target cannot pin host memory (the CPU, which torch
refuses to pin without an accelerator), ``pin_memory=True`` becomes False: a pinned staging
buffer is host memory either way, and where device memory is host memory the tensor is known as
pinned all the same (``activation.pinning``): ``is_pinned()`` is True and a move from it copies.
"""

import importlib

import torch

from ..patching.device_parameters import takes
from ..patching.rewriter import DEVICE, PIN_MEMORY, Argument, Rewrite, rewrite

# Where torch keeps constructors whose registered name differs from their attribute name
# (``fft_fftfreq`` is ``torch.fft.fftfreq``).
_OWNERS = ("torch", "torch.fft", "torch.nested", "torch.sparse", "torch.special")


def constructors():
    """[(owner module, attribute name)] for every constructor that takes ``device=``."""
    import torch.utils._device as device_utils

    wanted = set(device_utils._device_constructors())
    wanted.update(getattr(torch, n) for n in dir(torch) if n.endswith("_like"))
    wanted.add(torch.normal)
    found = []
    for owner_name in _OWNERS:
        owner = importlib.import_module(owner_name)
        for name in dir(owner):
            if name.startswith("_"):
                continue
            value = getattr(owner, name, None)
            try:
                if value in wanted:
                    found.append((owner, name))
            except TypeError:
                continue
    return found


def _declaration(owner, name):
    """Constructors take their device by keyword only (positionals are sizes and data); the
    ones that take pin_memory have it unpinned where the target cannot pin. A tensor made on
    the device is placed there (``activation.placing``)."""
    arguments = [Argument(DEVICE)]
    if takes(getattr(owner, name), "pin_memory"):
        arguments.append(Argument(PIN_MEMORY, "pin_memory"))
    return Rewrite(f"{owner.__name__}:{name}", tuple(arguments), places=True, inherits=name.endswith("_like"))


REWRITES = (
    *(_declaration(owner, name) for owner, name in constructors()),
    rewrite("torch:from_file", DEVICE),                  # not in torch's table
    rewrite("torch.nested:as_nested_tensor", DEVICE),    # a Python function over a C one
    # Block masks are built on device="cuda" when the caller names none.
    *(rewrite(f"torch.nn.attention.flex_attention:{name}", DEVICE, missing="cuda")
      for name in ("create_block_mask", "create_mask")),
    rewrite("torch.nn.attention.flex_attention:BlockMask.to", DEVICE),
    rewrite("torch.utils.dlpack:from_dlpack", DEVICE),
)
