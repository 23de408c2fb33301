"""Portable bit packing on any torch device, bit-exact with numpy.packbits/unpackbits.

Packing works on 64-bit words: eight 0/1 bytes ``b0..b7`` read as one little-endian int64
``v = sum(b_i << 8i)``, times ``0x8040201008040201``, put ``sum(b_i << (7 - i))`` (numpy's
"big" bit order) in the top byte without carries between the partial products. The
product wraps modulo 2**64, as integer multiplication does on every device torch runs
on; the comparison with numpy in the tests holds each device to it. Words are processed
in chunks through one small scratch buffer: allocating a fresh full-size temporary costs
more (in page faults) than the arithmetic.
"""

from __future__ import annotations

import sys
from typing import Optional

import torch

_MULTIPLIER = {"big": 0x8040201008040201 - 2 ** 64,      # the int64 with the same bits
               "little": 0x0102040810204080}
# Unpacking spreads a byte to all eight bytes of a word, then keeps bit i (little) or bit
# 7 - i (big) in byte i; a byte that kept its bit is non-zero.
_SPREAD = 0x0101010101010101
_KEEP = {"big": 0x0102040810204080, "little": 0x8040201008040201 - 2 ** 64}
_WORDS_PER_CHUNK = 1 << 19                                 # 4 MiB of int64 scratch
_BIT_ORDERS = ("big", "little")


def _check_bitorder(bitorder: str) -> None:
    if bitorder not in _BIT_ORDERS:
        raise ValueError("'order' must be either 'little' or 'big'")


def packbits(x: torch.Tensor, bitorder: str = "big") -> torch.Tensor:
    """``numpy.packbits(x, axis=None, bitorder=bitorder)``: the flattened input, non-zero
    as 1, eight to a uint8, the last byte padded with zeros."""
    _check_bitorder(bitorder)
    if x.dtype.is_floating_point or x.dtype.is_complex:
        raise TypeError("Expected an input array of integer or boolean data type")
    bits = x.reshape(-1)
    if bits.dtype != torch.bool:
        bits = bits != 0
    return _pack_bool(bits, bitorder)


def pack_signs(x: torch.Tensor) -> torch.Tensor:
    """Pack the signs of a float tensor: bit 1 where ``x >= 0`` (zero counts as positive)."""
    if not x.dtype.is_floating_point:
        raise TypeError(f"pack_signs expects a floating-point tensor, got {x.dtype}")
    return _pack_bool(x.reshape(-1) >= 0, "big")


def unpackbits(packed: torch.Tensor, count: Optional[int] = None, bitorder: str = "big") -> torch.Tensor:
    """``numpy.unpackbits(packed, axis=None, count=count, bitorder=bitorder)``: uint8 0/1."""
    _check_bitorder(bitorder)
    if packed.dtype != torch.uint8:
        raise TypeError("Expected an input array of unsigned byte data type")
    flat = packed.reshape(-1)
    out = torch.empty(flat.numel() * 8, dtype=torch.bool, device=packed.device)
    if flat.numel():
        if packed.device.type == "cpu" and sys.byteorder != "little":
            order = range(7, -1, -1) if bitorder == "big" else range(8)
            shifts = torch.tensor(list(order), dtype=torch.uint8)
            out.copy_((flat.reshape(-1, 1) >> shifts).bitwise_and_(1).reshape(-1))
        else:
            _unpack_words(flat, out.view(-1, 8), bitorder)
    return apply_count(out.view(torch.uint8), count)


def unpack_signs(packed: torch.Tensor, count: Optional[int] = None,
                 dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The inverse of ``pack_signs``: +1.0 for a set bit, -1.0 for a clear one."""
    return unpackbits(packed, count).to(dtype).mul_(2).sub_(1)


def apply_count(bits: torch.Tensor, count: Optional[int]) -> torch.Tensor:
    """numpy's ``count``: keep the first ``count`` bits, zero-padding past the end; a
    negative count trims that many from the end."""
    if count is None:
        return bits
    count = int(count)
    total = bits.numel()
    if count < 0:
        if -count > total:
            raise ValueError("-count larger than number of elements")
        return bits[:total + count]
    if count <= total:
        return bits[:count]
    return torch.cat([bits, bits.new_zeros(count - total)])


def _pack_bool(bits: torch.Tensor, bitorder: str) -> torch.Tensor:
    n = bits.numel()
    whole = n - n % 8
    out = torch.empty((n + 7) // 8, dtype=torch.uint8, device=bits.device)
    if whole:
        _pack_words(bits[:whole], out[:whole // 8], bitorder)
    if whole != n:                             # the last, partial byte
        order = range(7, -1, -1) if bitorder == "big" else range(8)
        weights = torch.tensor([1 << s for s in order][:n - whole], dtype=torch.uint8,
                               device=bits.device)
        out[-1] = (bits[whole:].to(torch.uint8) * weights).sum(dtype=torch.uint8)
    return out


def _unpack_words(flat: torch.Tensor, out: torch.Tensor, bitorder: str) -> None:
    keep = _KEEP[bitorder]
    scratch = torch.empty(min(_WORDS_PER_CHUNK, flat.numel()), dtype=torch.int64, device=flat.device)
    for start in range(0, flat.numel(), _WORDS_PER_CHUNK):
        stop = min(start + _WORDS_PER_CHUNK, flat.numel())
        part = scratch[:stop - start]
        part.copy_(flat[start:stop])
        part.mul_(_SPREAD).bitwise_and_(keep)
        torch.ne(part.view(torch.uint8).view(-1, 8), 0, out=out[start:stop])


def _pack_words(bits: torch.Tensor, out: torch.Tensor, bitorder: str) -> None:
    as_bytes = bits.view(torch.uint8)
    if bits.device.type == "cpu" and sys.byteorder != "little":
        weights = torch.tensor([1 << (7 - i) if bitorder == "big" else 1 << i for i in range(8)],
                               dtype=torch.uint8)
        out.copy_((as_bytes.view(-1, 8) * weights).sum(1, dtype=torch.uint8))
        return
    try:
        words = as_bytes.view(torch.int64)
    except RuntimeError:                       # an offset that is no multiple of 8 bytes
        words = as_bytes.clone().view(torch.int64)
    multiplier = _MULTIPLIER[bitorder]
    scratch = torch.empty(min(_WORDS_PER_CHUNK, words.numel()), dtype=torch.int64, device=bits.device)
    for start in range(0, words.numel(), _WORDS_PER_CHUNK):
        stop = min(start + _WORDS_PER_CHUNK, words.numel())
        part = scratch[:stop - start]
        torch.mul(words[start:stop], multiplier, out=part)
        part.bitwise_right_shift_(56)          # the top byte, sign-extended; the cast keeps it
        out[start:stop].copy_(part)
