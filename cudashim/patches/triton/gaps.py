"""What Triton's interpreter lacks, made good for kernels written for CUDA.

- Float arguments: the interpreter hands them to the kernel as Python floats, which have no
  ``.to()`` (Liger's RMSNorm: ``eps.to(tl.float32)``); CUDA's launcher passes float32 scalars.
- Scalars as indices: before Triton 3.4 the interpreter turns a scalar into an int with
  ``int(array)``, which numpy 2.4 refuses for the one-element arrays it keeps scalars in
  (``range(row_start, row_end)`` in a kernel: "only 0-dimensional arrays can be converted").
- Loop counters: a compiled kernel's ``for i in range(n)`` (or ``tl.range``) counts in a Triton
  scalar, which kernels convert (``i.to(tl.int64)``, flash-linear-attention's chunked kernels);
  the interpreter's counter is a Python int. Triton 3.3 and later rewrite a kernel's source
  before interpreting it; the rewrite here also makes each such counter a scalar tensor
  (``tl.static_range`` counters stay Python ints, as they are constants when compiled).
- numpy 2 under Triton 3.0: that interpreter was built against numpy 1's C interface and, with
  numpy 2, stores nothing, silently. ``store_works()`` finds out once, with a one-element
  kernel, and the launches refuse with the reason instead of returning what was never written.
"""

from __future__ import annotations

import ast
import functools

import numpy as np
import triton
import triton.language as tl


def float_scalars(handle_class):
    """The interpreter's argument conversion, with Python floats made float32 scalars."""
    def convert(original):
        @functools.wraps(original)
        def implicit_cvt(arg):
            if isinstance(arg, float):
                return tl.tensor(handle_class(np.array([arg], dtype=np.float32), tl.float32), tl.float32)
            return original(arg)
        return implicit_cvt
    return convert


def _scalar_index(self) -> int:
    return int(self.handle.data.reshape(-1)[0])


def indexable_scalars(original):
    """The interpreter's patch of ``tl.tensor``, with scalars usable as indices on numpy 2."""
    @functools.wraps(original)
    def patch_lang_tensor(tensor, *scope):
        result = original(tensor, *scope)
        tensor.__index__ = _scalar_index
        return result
    return patch_lang_tensor


def _counts_in_range(loop: ast.For) -> bool:
    """``for i in range(...)`` or ``for i in tl.range(...)``: not ``static_range``."""
    call = loop.iter
    if not isinstance(call, ast.Call) or not isinstance(loop.target, ast.Name):
        return False
    name = call.func.id if isinstance(call.func, ast.Name) else \
        call.func.attr if isinstance(call.func, ast.Attribute) else ""
    return name == "range"


def visit_for(self, loop: ast.For):
    """``ASTTransformer.visit_For``: the loop's counter becomes a scalar tensor on each turn,
    assigned as the interpreter's rewrite assigns every value (``visit_Assign``)."""
    self.generic_visit(loop)
    if _counts_in_range(loop):
        counter = loop.target.id
        assignment = ast.Assign(targets=[ast.Name(id=counter, ctx=ast.Store())],
                                value=ast.Name(id=counter, ctx=ast.Load()))
        loop.body.insert(0, ast.fix_missing_locations(ast.copy_location(self.visit_Assign(assignment), loop)))
    return loop


@triton.jit
def _store_one(out_ptr):
    tl.store(out_ptr, 1.0)


@functools.lru_cache(maxsize=None)
def store_works() -> str:
    """'' where the interpreter's stores reach memory; else why they do not."""
    import torch
    out = torch.zeros(1, dtype=torch.float32, device="cpu")
    from triton.runtime.interpreter import InterpretedFunction
    InterpretedFunction(_store_one.fn).run(out, grid=(1,), warmup=False)
    if out.item() == 1.0:
        return ""
    return (f"triton {triton.__version__}'s interpreter stores nothing with numpy {np.__version__} "
            "(it was built against numpy 1): install numpy<2 beside it, or a newer triton")
