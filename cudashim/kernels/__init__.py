"""Ops CUDA programs get from CUDA-only libraries, on any device.

    from cudashim.kernels import packbits, unpackbits, pack_signs, CompressedBackend

Each op runs a portable torch implementation, or the fast path registered for the
tensor's device type (``register_kernel``); ``kernel_info()`` says which is in use.
"""

import torch

from . import bits
from .registry import define, kernel_info, register_kernel


def _probe_bits(device):
    x = torch.arange(1003, device=device) % 3 == 0
    return [(x, "big"), (x, "little")]


def _probe_packed(device):
    packed = (torch.arange(126, device=device) * 37 % 256).to(torch.uint8)
    return [(packed, None, "big"), (packed, 1001, "little"), (packed, -5, "big")]


def _probe_floats(device):
    return [(torch.linspace(-2, 2, 1001, device=device),)]


def _probe_signs(device):
    packed = (torch.arange(126, device=device) * 37 % 256).to(torch.uint8)
    return [(packed, 1001)]


def _equal(fast, portable) -> bool:
    return fast.shape == portable.shape and torch.equal(fast.cpu(), portable.cpu().to(fast.dtype))


packbits = define("packbits", bits.packbits, _probe_bits, _equal)
unpackbits = define("unpackbits", bits.unpackbits, _probe_packed, _equal)
pack_signs = define("pack_signs", bits.pack_signs, _probe_floats, _equal)
unpack_signs = define("unpack_signs", bits.unpack_signs, _probe_signs, _equal)

from .fast_paths import register_builtin  # noqa: E402

register_builtin()

from .compressed import CompressedBackend, error_buffer_size  # noqa: E402

__all__ = ["packbits", "unpackbits", "pack_signs", "unpack_signs", "register_kernel",
           "kernel_info", "CompressedBackend", "error_buffer_size"]
