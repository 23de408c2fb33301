"""The compiled host-memory kernels (``cudashim.kernels._native``), where they run.

Built by ``pip install`` with the package where a C compiler exists. Used for contiguous
CPU tensors only; everything else takes the portable torch versions in bits.py, which give
the same bits. The pure_python setting (``--pure-python``, ``CUDASHIM_PURE_PYTHON=1``) turns
them off too: an activation hands its setting here; used without one, the kernels read it
from the environment, the one place below the activation that does.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Optional

import torch

from . import bits

try:
    from . import _native
except ImportError:                      # built without a compiler
    _native = None


def unavailable() -> Optional[str]:
    """None where the compiled kernels can run, else why not."""
    if _native is None:
        return "the compiled kernels were not built (no C compiler at install time)"
    if sys.byteorder != "little":
        return "the compiled kernels read words little-endian; this host is big-endian"
    return None


# Whether the portable kernels run even where the compiled ones can: handed by an activation
# (its pure_python setting, through its registry, so deactivation takes it back) or by
# portable_only(). None: nobody handed a choice (the kernels used as a library), and the
# pure_python setting of the environment decides, read once.
handed_portable: Optional[bool] = None
_environment_portable: Optional[bool] = None


def portable_asked() -> bool:
    global _environment_portable
    if handed_portable is not None:
        return handed_portable
    if _environment_portable is None:
        from .._settings import load           # the one import up: see the docstring above
        _environment_portable = load().pure_python
    return _environment_portable


def usable() -> bool:
    """Whether the compiled kernels run now."""
    return unavailable() is None and not portable_asked()


def why_not_used() -> Optional[str]:
    """None where the compiled kernels run now, else why not."""
    if portable_asked():
        return "the pure_python setting asks for the portable kernels"
    return unavailable()


@contextlib.contextmanager
def portable_only():
    """Run the portable torch versions inside (benchmarks compare the two in one run)."""
    global handed_portable
    saved, handed_portable = handed_portable, True
    try:
        yield
    finally:
        handed_portable = saved


def _threads() -> int:
    """The kernels split their loops over as many threads as torch's own CPU ops use."""
    return torch.get_num_threads()


def empty(numel: int, dtype: torch.dtype) -> torch.Tensor:
    """A fresh host tensor, advised onto huge pages before its first touch."""
    out = torch.empty(numel, dtype=dtype)
    if out.numel():
        _native.advise_huge(out.data_ptr(), out.numel() * out.element_size())
    return out


def _host_bytes(x: torch.Tensor) -> torch.Tensor:
    """``x`` flattened, as contiguous 0/1 bytes (a bool tensor holds nothing else)."""
    flat = x.reshape(-1)
    if flat.dtype != torch.bool:
        flat = flat != 0
    return flat.contiguous()


def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    bits._check_bitorder(bitorder)
    if x.dtype.is_floating_point or x.dtype.is_complex:
        raise TypeError("Expected an input array of integer or boolean data type")
    return _pack(_host_bytes(x), bitorder)


def _pack(flat: torch.Tensor, bitorder: str) -> torch.Tensor:
    n = flat.numel()
    whole = n // 8
    out = empty((n + 7) // 8, torch.uint8)
    if whole:
        _native.pack_bytes(flat.data_ptr(), whole, out.data_ptr(), bitorder == "little", _threads())
    if whole * 8 != n:                             # the last, partial byte
        out[whole:] = bits.packbits(flat[whole * 8:], bitorder)
    return out


def unpackbits(packed: torch.Tensor, count: Optional[int] = None, bitorder: str = "big") -> torch.Tensor:
    bits._check_bitorder(bitorder)
    if packed.dtype != torch.uint8:
        raise TypeError("Expected an input array of unsigned byte data type")
    flat = packed.reshape(-1).contiguous()
    out = empty(flat.numel() * 8, torch.uint8)
    if flat.numel():
        _native.unpack_bytes(flat.data_ptr(), flat.numel(), out.data_ptr(), bitorder == "little", _threads())
    return bits.apply_count(out, count)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    if not x.dtype.is_floating_point:
        raise TypeError(f"pack_signs expects a floating-point tensor, got {x.dtype}")
    flat = x.reshape(-1)
    if flat.dtype != torch.float32 or flat.numel() % 8:
        return _pack((flat >= 0).contiguous(), "big")
    flat = flat.contiguous()
    out = empty(flat.numel() // 8, torch.uint8)
    _native.pack_signs_f32(flat.data_ptr(), flat.numel(), out.data_ptr(), _threads())
    return out


def unpack_signs(packed: torch.Tensor, count: Optional[int] = None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    if packed.dtype != torch.uint8 or dtype != torch.float32:
        return bits.unpack_signs(packed, count, dtype)
    flat = packed.reshape(-1).contiguous()
    out = empty(flat.numel() * 8, torch.float32)
    if flat.numel():
        expand_signs(flat, torch.ones(1), out)
    return bits.apply_count(out, count)


def expand_signs(packed: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` (contiguous float32) gets the first ``out.numel()`` signs of ``packed`` (one
    row per scale, contiguous uint8), each times its row's scale."""
    columns = packed.numel() * 8 // scales.numel()
    scales = _host_scales(scales)
    _native.expand_signs_f32(packed.data_ptr(), columns, scales.data_ptr(), out.data_ptr(),
                             out.numel(), _threads())


def _host_scales(scales: torch.Tensor) -> torch.Tensor:
    return scales.reshape(-1).to(torch.float32).contiguous()


def compress_compensated(buffer: torch.Tensor, error: torch.Tensor):
    """compressed.py's ``compensate_and_compress`` for contiguous float32 CPU tensors:
    ``error[:buffer.numel()] += buffer``, then compressed in place, in two passes."""
    packed = empty(error.numel() // 8, torch.uint8)
    scale = _native.compress_compensated_f32(buffer.data_ptr(), buffer.numel(), error.data_ptr(),
                                             error.numel(), packed.data_ptr(), _threads())
    return torch.tensor(scale, dtype=torch.float32), packed


def compress_server(signs: torch.Tensor, scales: torch.Tensor, error: torch.Tensor):
    """compressed.py's ``server_compress`` for contiguous CPU tensors: ``error`` += the mean
    over rows of the packed signs times their scales, then compressed in place."""
    packed = empty(error.numel() // 8, torch.uint8)
    scales = _host_scales(scales)
    scale = _native.compress_server_f32(signs.data_ptr(), scales.numel(), scales.data_ptr(),
                                        error.data_ptr(), error.numel(), packed.data_ptr(), _threads())
    return torch.tensor(scale, dtype=torch.float32), packed
