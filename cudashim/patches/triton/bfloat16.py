"""bfloat16 arithmetic in Triton's interpreter.

numpy has no bfloat16, so the interpreter keeps bfloat16 values as their raw 16 bits (uint16)
and converts only between them and float32. Everything else a kernel does to a bfloat16 value
(``x * w``, ``tl.exp(x)``, ``acc + x``) is integer arithmetic on the bits, and the result is
garbage: Liger's RMSNorm under bfloat16 autocast returns NaN. CUDA computes bfloat16 arithmetic in
float32 and rounds each result to bfloat16. The interpreter here does the same: a bfloat16 value
lives as a float32 array holding a bfloat16-representable value; loads widen the bits, stores
round to nearest even, each arithmetic result typed bfloat16 is rounded, and casts and bitcasts
convert between the representations. Atomics on bfloat16 memory are not served: the kernel is
refused, naming them.
"""

from __future__ import annotations

import functools

import numpy as np
import triton.language as tl

_FLOAT32 = np.dtype(np.float32)


def widened(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bits -> the same values as float32."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def narrowed(values: np.ndarray, truncate: bool = False) -> np.ndarray:
    """float32 values -> bfloat16 bits, rounded to nearest even (or toward zero); NaN stays NaN."""
    values = np.asarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    if not truncate:
        bits = bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))
    narrow = (bits >> 16).astype(np.uint16)
    return np.where(np.isnan(values), np.uint16(0x7FC0), narrow)


def rounded(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to the nearest bfloat16, still float32."""
    return widened(narrowed(values))


def _is_bf16(dtype) -> bool:
    return getattr(dtype, "scalar", dtype) == tl.bfloat16


def install(activation, interpreter) -> None:
    """Patch the interpreter module ``interpreter`` for the activation's lifetime."""
    TensorHandle = interpreter.TensorHandle
    Builder = interpreter.InterpreterBuilder
    load_memory = interpreter._interpreter.load

    def np_dtype(original):
        @functools.wraps(original)
        def get_np_dtype(tt_dtype):
            element = tt_dtype.element_ty if isinstance(tt_dtype, tl.block_type) else tt_dtype
            if element == tl.bfloat16:          # not a pointer to bfloat16: pointers stay uint64
                return _FLOAT32
            return original(tt_dtype)
        return get_np_dtype

    def masked_load(original):
        @functools.wraps(original)
        def create_masked_load(self, ptrs, mask, other, *rest):
            element = ptrs.get_element_ty()
            if element != tl.bfloat16:
                return original(self, ptrs, mask, other, *rest)
            other_bits = np.zeros_like(ptrs.data, dtype=np.uint16) if other is None else \
                narrowed(np.broadcast_to(other.data, ptrs.data.shape))
            bits = load_memory(ptrs.data, mask.data, other_bits, np.dtype(np.uint16))
            return TensorHandle(widened(bits), element)
        return create_masked_load

    def masked_store(original):
        @functools.wraps(original)
        def create_masked_store(self, ptrs, value, mask, *rest):
            if _is_bf16(value.dtype) and value.data.dtype == _FLOAT32:
                value = TensorHandle(narrowed(value.data), value.dtype)
            return original(self, ptrs, value, mask, *rest)
        return create_masked_store

    def cast(original):
        @functools.wraps(original)
        def cast_impl(self, src, dst_type):
            if _is_bf16(src.dtype) or _is_bf16(dst_type):
                values = src.data.astype(np.float32) if _is_bf16(dst_type) else src.data
                data = rounded(values) if _is_bf16(dst_type) else \
                    values.astype(interpreter._get_np_dtype(dst_type))
                return TensorHandle(data, dst_type.scalar)
            return original(self, src, dst_type)
        return cast_impl

    def fp_to_fp(original):
        @functools.wraps(original)
        def create_fp_to_fp(self, src, dst_type, rounding_mode):
            if _is_bf16(dst_type) and src.data.dtype in (np.float32, np.float64, np.float16):
                truncate = "RTZ" in str(rounding_mode).upper()
                return TensorHandle(widened(narrowed(src.data.astype(np.float32), truncate)), dst_type.scalar)
            if _is_bf16(src.dtype) and not _is_bf16(dst_type) and dst_type.scalar.is_floating() \
                    and dst_type.scalar.primitive_bitwidth >= 16 and not dst_type.scalar.is_fp8():
                return TensorHandle(src.data.astype(interpreter._get_np_dtype(dst_type)), dst_type.scalar)
            if _is_bf16(src.dtype):          # to float8: from the bits, as the interpreter does
                src = TensorHandle(narrowed(src.data), src.dtype)
            return original(self, src, dst_type, rounding_mode)
        return create_fp_to_fp

    def bitcast(original):
        @functools.wraps(original)
        def create_bitcast(self, src, dst_type):
            if _is_bf16(src.dtype):
                src = TensorHandle(narrowed(src.data), src.dtype)
            if _is_bf16(dst_type):
                return TensorHandle(widened(src.data.view(np.uint16)), dst_type.scalar)
            return original(self, src, dst_type)
        return create_bitcast

    def rounding_result(original):
        @functools.wraps(original)
        def op(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if _is_bf16(result.dtype) and result.data.dtype == _FLOAT32:
                result = TensorHandle(rounded(result.data), result.dtype)
            return result
        return op

    def no_bf16_atomics(original):
        @functools.wraps(original)
        def atomic(self, *args, **kwargs):
            if any(isinstance(arg, TensorHandle) and _is_bf16(arg.dtype) for arg in args):
                raise NotImplementedError("atomics on bfloat16 memory")
            return original(self, *args, **kwargs)
        return atomic

    def data_size(original):
        @functools.wraps(original)
        def validate_np_data_size(np_array, tl_dtype):
            if _is_bf16(tl_dtype) and np_array.dtype == _FLOAT32:
                return True
            return original(np_array, tl_dtype)
        return validate_np_data_size

    activation.replace(interpreter, "_get_np_dtype", np_dtype)
    # Triton 3.4 and later check each handle's width against its type's; earlier ones do not.
    activation.replace(interpreter, "_validate_np_data_size", data_size)
    activation.replace(Builder, "create_masked_load", masked_load)
    activation.replace(Builder, "create_masked_store", masked_store)
    activation.replace(Builder, "cast_impl", cast)
    activation.replace(Builder, "create_fp_to_fp", fp_to_fp)
    activation.replace(Builder, "create_bitcast", bitcast)
    for arithmetic in ("binary_op", "unary_op", "ternary_op"):
        activation.replace(Builder, arithmetic, rounding_result)
    for atomic in ("create_atomic_rmw", "create_atomic_cas"):
        activation.replace(Builder, atomic, no_bf16_atomics)
