"""CUDA's libdevice math for kernels run through Triton's interpreter.

Kernels call libdevice for what ``triton.language`` lacks or computes less exactly
(``from triton.language.extra.libdevice import rsqrt, tanh``; ``libdevice.pow``). A compiler
backend maps those calls to its device library; the interpreter has none: Triton 3.0 raises
"extern_elementwise not supported in interpreter mode", later releases return None from the
stub and fail a line later. Here each function a kernel can reach is computed with numpy on the
interpreter's arrays, in the argument's dtype, as libdevice computes it to within its stated
error; the rounding-mode variants (``_rn``, ``_rz``, ...) round to nearest, as numpy does.
"""

from __future__ import annotations

import math
from typing import Callable, Dict

import numpy as np


def _vectorized(fn) -> Callable:
    return np.vectorize(fn, otypes=[np.float64])


def _round_half_away(x):
    return np.sign(x) * np.floor(np.abs(x) + 0.5)


_erf, _erfc = _vectorized(math.erf), _vectorized(math.erfc)
_lgamma, _tgamma = _vectorized(math.lgamma), _vectorized(math.gamma)

# name -> numpy function of the arguments' arrays, with a float result in the argument's dtype
FLOAT: Dict[str, Callable] = {
    "abs": np.abs, "floor": np.floor, "ceil": np.ceil, "trunc": np.trunc, "rint": np.rint,
    "nearbyint": np.rint, "round": _round_half_away,
    "exp": np.exp, "exp2": np.exp2, "exp10": lambda x: np.power(10.0, x), "expm1": np.expm1,
    "log": np.log, "log2": np.log2, "log10": np.log10, "log1p": np.log1p,
    "sqrt": np.sqrt, "rsqrt": lambda x: 1.0 / np.sqrt(x), "cbrt": np.cbrt, "rcbrt": lambda x: 1.0 / np.cbrt(x),
    "sin": np.sin, "cos": np.cos, "tan": np.tan, "sinpi": lambda x: np.sin(np.pi * x),
    "cospi": lambda x: np.cos(np.pi * x), "asin": np.arcsin, "acos": np.arccos, "atan": np.arctan,
    "sinh": np.sinh, "cosh": np.cosh, "tanh": np.tanh, "asinh": np.arcsinh, "acosh": np.arccosh,
    "atanh": np.arctanh, "erf": _erf, "erfc": _erfc, "lgamma": _lgamma, "tgamma": _tgamma,
    "saturatef": lambda x: np.clip(x, 0.0, 1.0),
    "pow": np.power, "atan2": np.arctan2, "hypot": np.hypot, "copysign": np.copysign,
    "fmod": np.fmod, "remainder": np.remainder, "nextafter": np.nextafter,
    "fdim": lambda x, y: np.maximum(x - y, 0.0), "fmax": np.fmax, "fmin": np.fmin,
    "fma": lambda x, y, z: x * y + z,
    "fast_expf": np.exp, "fast_exp10f": lambda x: np.power(10.0, x), "fast_logf": np.log,
    "fast_log2f": np.log2, "fast_log10f": np.log10, "fast_sinf": np.sin, "fast_cosf": np.cos,
    "fast_tanf": np.tan, "fast_tanhf": np.tanh, "fast_powf": np.power,
    "fast_dividef": np.divide,
}
for rounding in ("rn", "rz", "rd", "ru"):
    FLOAT.update({f"sqrt_{rounding}": np.sqrt, f"rcp_{rounding}": lambda x: 1.0 / x,
                  f"div_{rounding}": np.divide, f"add_{rounding}": np.add,
                  f"sub_{rounding}": np.subtract, f"mul_{rounding}": np.multiply,
                  f"fma_{rounding}": FLOAT["fma"]})
FLOAT["rsqrt_rn"] = FLOAT["rsqrt"]

# name -> numpy predicate: the result is a boolean (Triton's int1)
PREDICATE: Dict[str, Callable] = {
    "isnan": np.isnan, "isinf": np.isinf, "signbit": np.signbit, "finitef": np.isfinite,
    "isfinited": np.isfinite,
}

NAMES = frozenset(FLOAT) | frozenset(PREDICATE)


def is_libdevice_module(name: str) -> bool:
    """``triton.language.extra.libdevice`` and each backend's (``extra.cuda.libdevice``)."""
    return name.startswith("triton.language.extra") and name.endswith("libdevice")


def function(name: str) -> Callable:
    """The interpreted libdevice function ``name`` (one of ``NAMES``)."""
    import triton.language as tl
    from triton.runtime.interpreter import TensorHandle

    predicate = name in PREDICATE
    compute = PREDICATE[name] if predicate else FLOAT[name]

    def interpreted(*args, **_builder):
        tensors = [arg for arg in args if isinstance(arg, tl.tensor)]
        if not tensors:
            raise TypeError(f"libdevice.{name} takes a tensor")
        widest = max(tensors, key=lambda t: len(t.shape) if t.type.is_block() else 0)
        scalar = widest.dtype.scalar if hasattr(widest.dtype, "scalar") else widest.dtype
        arrays = [arg.handle.data if isinstance(arg, tl.tensor) else arg for arg in args]
        with np.errstate(all="ignore"):     # inf and nan come out as on the device
            result = np.asarray(compute(*arrays))
        if predicate:
            result_scalar, result = tl.int1, result.astype(np.bool_)
        else:
            result_scalar, result = scalar, result.astype(widest.handle.data.dtype)
        result_type = tl.block_type(result_scalar, widest.type.shape) if widest.type.is_block() \
            else result_scalar
        return tl.tensor(TensorHandle(result, result_scalar), result_type)

    interpreted.__name__ = interpreted.__qualname__ = name
    interpreted.__module__ = __name__
    return interpreted
