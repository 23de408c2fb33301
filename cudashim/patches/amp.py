"""AMP: ``torch.autocast("cuda")``, ``GradScaler("cuda")`` and the autocast state queries.

The classes are patched in place (their ``__init__``), not replaced, so ``torch.autocast``
stays the class torch and its compiler know. A CUDA autocast dtype the target cannot run
falls back to the target's first supported dtype, with a warning once.
"""

import functools

import torch

from ..errors import warn_once

# Functions whose first argument (or ``device_type=``) is a device type string.
_DEVICE_TYPE_FUNCTIONS = ("is_autocast_enabled", "set_autocast_enabled", "get_autocast_dtype",
                          "set_autocast_dtype", "is_autocast_available")


def install(ctx):
    backend = ctx.backend
    supported = backend.autocast_dtypes()
    translate_autocast = ctx.translate_type("torch.autocast")

    def make_autocast_init(original):
        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda":
                device_type = translate_autocast(device_type)
                if dtype is None:
                    dtype = torch.float16          # CUDA's default autocast dtype
                if dtype not in supported:
                    warn_once(f"autocast-{dtype}",
                              f"autocast: the '{backend.name}' backend cannot autocast to {dtype}; "
                              f"using {supported[0]}")
                    dtype = supported[0]
            original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        return functools.wraps(original)(__init__)

    ctx.replace(torch.amp.autocast_mode.autocast, "__init__", make_autocast_init)

    translate_scaler = ctx.translate_type("torch.amp.GradScaler")

    def make_scaler_init(original):
        def __init__(self, device="cuda", *args, **kwargs):
            original(self, translate_scaler(device), *args, **kwargs)
        return functools.wraps(original)(__init__)

    ctx.replace(torch.amp.grad_scaler.GradScaler, "__init__", make_scaler_init)

    for name in _DEVICE_TYPE_FUNCTIONS:
        if hasattr(torch, name):
            ctx.replace(torch, name, functools.partial(
                _device_type_first, translate=ctx.translate_type(f"torch.{name}")))

    for name in ("custom_fwd", "custom_bwd"):
        ctx.replace(torch.amp, name, functools.partial(
            _device_type_keyword, translate=ctx.translate_type(f"torch.amp.{name}")))


def _device_type_first(original, translate):
    def function(*args, **kwargs):
        if args:
            args = (translate(args[0]),) + args[1:]
        elif "device_type" in kwargs:
            kwargs["device_type"] = translate(kwargs["device_type"])
        return original(*args, **kwargs)
    return functools.wraps(original)(function)


def _device_type_keyword(original, translate):
    def decorator(*args, **kwargs):
        if "device_type" in kwargs:
            kwargs["device_type"] = translate(kwargs["device_type"])
        return original(*args, **kwargs)
    return functools.wraps(original)(decorator)
