"""Every tensor constructor that takes ``device=``.

The list is torch's own (``torch.utils._device._device_constructors()``, the table torch
uses for ``with torch.device(...)``) plus the ``*_like`` functions and ``torch.normal``.
"""

import importlib

import torch

from .rewriter import DEVICE, rewrite

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


# Constructors take their device by keyword only (positionals are sizes and data).
REWRITES = tuple(rewrite(f"{owner.__name__}:{name}", DEVICE) for owner, name in constructors())
