"""Argument translation shared by patches of ``.to(...)``-style methods."""

import functools

import torch


def to_method(original, translate):
    """``original`` with its device translated, given first positionally or as ``device=``
    (``Tensor.to``, ``Module.to``). Anything else passes untouched: dtypes, tensors."""
    real_device = torch._C.device

    def to(self, *args, **kwargs):
        if args:
            first = args[0]
            cls = first.__class__
            if cls is str or cls is real_device or cls is int:
                args = (translate(first),) + args[1:]
        if kwargs:
            device = kwargs.get("device")
            if device is not None:
                kwargs["device"] = translate(device)
        return original(self, *args, **kwargs)
    return functools.wraps(original)(to)
