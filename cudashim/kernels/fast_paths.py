"""The built-in fast paths: compiled C on host memory, CuPy on CUDA, torch_npu's sign-bit
packing on Ascend NPUs.

Each is registered with an availability check that imports its library only when a tensor
of that device type first arrives, and is verified against the portable version once
before use (registry.py).
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch

from . import bits, native
from .registry import register_kernel


def _cupy_unavailable() -> Optional[str]:
    try:
        cupy = importlib.import_module("cupy")
    except ImportError:
        return "CuPy is not installed (pip install cupy-cuda12x)"
    try:
        if cupy.cuda.runtime.getDeviceCount() < 1:
            return "CuPy sees no CUDA device"
    except Exception as exc:                   # a CuPy built for another CUDA version
        return f"CuPy does not work here: {exc}"
    return None


def cupy_packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    import cupy
    bits._check_bitorder(bitorder)
    flat = x.reshape(-1)
    if flat.dtype.is_floating_point or flat.dtype.is_complex:
        raise TypeError("Expected an input array of integer or boolean data type")
    return torch.from_dlpack(cupy.packbits(cupy.from_dlpack(flat.contiguous()), bitorder=bitorder))


def cupy_unpackbits(packed: torch.Tensor, count: Optional[int] = None, bitorder: str = "big") -> torch.Tensor:
    import cupy
    bits._check_bitorder(bitorder)
    if packed.dtype != torch.uint8:
        raise TypeError("Expected an input array of unsigned byte data type")
    unpacked = cupy.unpackbits(cupy.from_dlpack(packed.reshape(-1).contiguous()), bitorder=bitorder)
    return bits.apply_count(torch.from_dlpack(unpacked), count)


def cupy_pack_signs(x: torch.Tensor) -> torch.Tensor:
    return cupy_packbits(x.reshape(-1) >= 0)


def _torch_npu_unavailable() -> Optional[str]:
    try:
        torch_npu = importlib.import_module("torch_npu")
    except ImportError:
        return "torch_npu is not installed (pip install torch-npu)"
    if not hasattr(torch_npu, "npu_sign_bits_pack"):
        return "this torch_npu has no npu_sign_bits_pack"
    return None


def npu_pack_signs(x: torch.Tensor) -> torch.Tensor:
    import torch_npu
    flat = x.reshape(-1)
    if flat.dtype not in (torch.float16, torch.float32):
        flat = flat.float()
    return torch_npu.npu_sign_bits_pack(flat, 1).reshape(-1)


def npu_unpack_signs(packed: torch.Tensor, count: Optional[int] = None,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    import torch_npu
    native = dtype if dtype in (torch.float16, torch.float32) else torch.float32
    signs = torch_npu.npu_sign_bits_unpack(packed.reshape(-1), 1, native).reshape(-1)
    return bits.apply_count(signs, count).to(dtype)


def register_builtin() -> None:
    for op in ("packbits", "unpackbits", "pack_signs", "unpack_signs"):
        register_kernel(op, "cpu", getattr(native, op), native.unavailable,
                        "compiled C (cudashim.kernels._native)",
                        wanted=lambda: not native.portable_asked())
    register_kernel("packbits", "cuda", cupy_packbits, _cupy_unavailable, "CuPy packbits")
    register_kernel("unpackbits", "cuda", cupy_unpackbits, _cupy_unavailable, "CuPy unpackbits")
    register_kernel("pack_signs", "cuda", cupy_pack_signs, _cupy_unavailable, "CuPy packbits")
    register_kernel("pack_signs", "npu", npu_pack_signs, _torch_npu_unavailable,
                    "torch_npu.npu_sign_bits_pack")
    register_kernel("unpack_signs", "npu", npu_unpack_signs, _torch_npu_unavailable,
                    "torch_npu.npu_sign_bits_unpack")
