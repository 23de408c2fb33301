"""The compiled host-memory kernels (``cudashim.kernels._native``), where they run.

Built by ``pip install`` with the package where a C compiler exists. Used for contiguous
CPU tensors only; everything else takes the portable torch versions in bits.py, which give
the same bits. The pure_python setting (``--pure-python``, ``CUDASHIM_PURE_PYTHON=1``) turns
them off too: an activation hands its setting here; used without one, the kernels read it
from the environment, the one place below the activation that does.

Each loop is compiled once per instruction set (AVX-512, AVX2 and SSE2 on x86-64; NEON on
arm64). At first use the widest variant this CPU runs that agrees with the portable versions
on a probe is chosen, once (not while torch.compile compiles: the portable versions serve
until then); a variant that disagrees is logged and passed over.
"""

from __future__ import annotations

import contextlib
import logging
import math
import sys
from typing import List, NamedTuple, Optional

import torch

from . import bits

try:
    from . import _native
except ImportError:                      # built without a compiler
    _native = None

log = logging.getLogger(__name__)


class Variant(NamedTuple):
    name: str
    needs: str                 # the CPU features it uses, as /proc/cpuinfo names them
    runs_here: bool


def variants() -> List[Variant]:
    """The instruction-set variants of this build, widest first."""
    return [Variant(*row) for row in _native.variants()] if _native is not None else []


# None: not chosen yet; else the chosen variant's name, or why none could be.
_choice: Optional[str] = None
_choice_failed = False


def unavailable() -> Optional[str]:
    """None where the compiled kernels can run, else why not."""
    if _native is None:
        return "the compiled kernels were not built (no C compiler at install time)"
    if sys.byteorder != "little":
        return "the compiled kernels read words little-endian; this host is big-endian"
    if _choice is None:
        if torch.compiler.is_compiling():
            # The probe's long sums answer None while torch.compile compiles (they are left out
            # of its graphs), which read as every variant disagreeing, for the whole process:
            # the first use that a compiled function's tracing made chose none (nano-vllm's).
            return "not chosen while torch.compile compiles: chosen at the first use after it"
        _choose_variant()
    return _choice if _choice_failed else None


def variant() -> Optional[str]:
    """The name of the variant the kernels run (chosen at first use); None where none runs."""
    if unavailable() is not None:
        return None
    return _native.variant()


def _choose_variant() -> None:
    global _choice, _choice_failed
    for candidate in variants():
        if not candidate.runs_here:
            continue
        _native.use_variant(candidate.name)
        disagreement = _disagreement_with_portable()
        if disagreement is None:
            log.debug("cudashim.kernels: the %s host kernels run", candidate.name)
            _choice, _choice_failed = candidate.name, False
            return
        log.warning("cudashim.kernels: the %s host kernels are not used: %s disagrees with the "
                    "portable version on a probe input", candidate.name, disagreement)
    _choice, _choice_failed = "no variant of the compiled kernels agrees with the portable versions", True


def _disagreement_with_portable() -> Optional[str]:
    """The first kernel of the variant in use whose result differs from the portable
    version's on a small probe (long enough for every vector loop), else None. Run at first
    use, which may come in a program that set a default dtype or device (a float16
    ``torch.cuda.HalfTensor`` default): every probe tensor names both."""
    host = {"device": "cpu"}
    flags = torch.arange(8 * 300 + 5, dtype=torch.int64, **host) % 3 == 0
    packed = (torch.arange(300, dtype=torch.int64, **host) * 37 % 256).to(torch.uint8)
    floats = torch.linspace(-2, 2, 8 * 300, dtype=torch.float32, **host)
    floats[::7] = 0.0
    floats[1::11] = -0.0
    floats[2::13] = float("nan")
    for bitorder in ("big", "little"):
        if not torch.equal(packbits(flags, bitorder), bits.packbits(flags, bitorder)):
            return f"packbits ({bitorder})"
        if not torch.equal(unpackbits(packed, None, bitorder), bits.unpackbits(packed, None, bitorder)):
            return f"unpackbits ({bitorder})"
    if not torch.equal(pack_signs(floats), bits.pack_signs(floats)):
        return "pack_signs"
    if not torch.equal(unpack_signs(packed), bits.unpack_signs(packed)):
        return "unpack_signs"
    finite = torch.nan_to_num(floats)
    error, buffer = finite.clone(), torch.linspace(1, 2, 100, dtype=torch.float32, **host)
    scale, signs = compress_compensated(buffer, error)
    expected = finite.clone()
    expected[:100] += buffer
    if not torch.equal(signs, bits.pack_signs(expected)) or not math.isclose(
            scale.item(), expected.norm().item() / math.sqrt(expected.numel()), rel_tol=1e-5):
        return "the compression"
    wide = finite.double()
    for kind, expected in ((SUM_ABS, wide.abs().sum()), (SUM_SQUARES, wide.norm()),
                           (SUM_PRODUCTS, wide.dot(wide.flip(0))),
                           (SUM_ABS_DIFFERENCES, (wide - wide.flip(0)).abs().sum()),
                           (SUM_SQUARED_DIFFERENCES, (wide - wide.flip(0)).norm())):
        flipped = finite.flip(0).contiguous()
        ours = long_sums(kind, finite, flipped if kind in _TWO_INPUTS else None, 3)
        if ours is None or not math.isclose(ours.double().sum().item() if kind not in
                                            (SUM_SQUARES, SUM_SQUARED_DIFFERENCES)
                                            else ours.double().norm().item(), expected.item(), rel_tol=1e-6):
            return f"the long sums (kind {kind})"
    # infinities at both ends, NaNs and subnormals between
    halves = torch.linspace(-70000, 70000, 1000, dtype=torch.float32, **host).half()
    halves[::9] = float("nan")
    halves[1::9] = torch.linspace(-1e-6, 1e-6, 111, dtype=torch.float32, **host).half()
    for source, target in ((halves, torch.bfloat16), (halves.bfloat16(), torch.float16)):
        ours = reduced_converted(source, target)
        if ours is not None and not torch.equal(torch.nan_to_num(ours), torch.nan_to_num(source.to(target))):
            return f"the conversion to {target}"
    return None


@contextlib.contextmanager
def using_variant(name: str):
    """Run the named variant inside (tests and benchmarks compare them); ValueError where this
    build has no such variant or this CPU cannot run it."""
    if unavailable() is not None:
        raise RuntimeError(f"the compiled kernels do not run here: {unavailable()}")
    saved = _native.variant()
    _native.use_variant(name)
    try:
        yield
    finally:
        _native.use_variant(saved)


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
    """A fresh host tensor (whatever default device the program set), advised onto huge pages
    before its first touch."""
    out = torch.empty(numel, dtype=dtype, device="cpu")
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
        expand_signs(flat, torch.ones(1, dtype=torch.float32, device="cpu"), out)
    return bits.apply_count(out, count)


def expand_signs(packed: torch.Tensor, scales: torch.Tensor, out: torch.Tensor) -> None:
    """``out`` (contiguous float32) gets the first ``out.numel()`` signs of ``packed`` (one
    row per scale, contiguous uint8), each times its row's scale."""
    columns = packed.numel() * 8 // scales.numel()
    scales = _host_scales(scales)
    _native.expand_signs_f32(packed.data_ptr(), columns, scales.data_ptr(), out.data_ptr(),
                             out.numel(), _threads())


def _host_scales(scales: torch.Tensor) -> torch.Tensor:
    return scales.reshape(-1).to(device="cpu", dtype=torch.float32).contiguous()


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


# What ``long_sums`` adds up, term by term (the kinds of ``_native.reduce_f32``, in its order).
SUM_ABS, SUM_SQUARES, SUM_PRODUCTS, SUM_ABS_DIFFERENCES, SUM_SQUARED_DIFFERENCES = range(5)
_TWO_INPUTS = (SUM_PRODUCTS, SUM_ABS_DIFFERENCES, SUM_SQUARED_DIFFERENCES)


def long_sums(kind: int, x: torch.Tensor, y: Optional[torch.Tensor] = None,
              rows: int = 1) -> Optional[torch.Tensor]:
    """Each of ``rows`` equal runs of ``x``'s elements (and ``y``'s, for the kinds of two inputs)
    summed term by term in double, as a float32 host tensor of ``rows`` values: the sum of |x|,
    of x*y or of |x - y|, or the square root of the sum of x^2 or (x - y)^2 (a 2-norm, a
    Euclidean distance). Terms are added in float32 over stretches of 256 and the stretches in
    double: as exact as CUDA's tree reductions, where torch's CPU kernels drift over millions.
    None where it does not apply: inputs that are not plain contiguous float32 host tensors of
    one length, a gradient to record (the result would not be on autograd's graph), tracing
    under torch.compile. The caller has checked ``usable()``, as for the kernels above."""
    inputs = (x, y) if kind in _TWO_INPUTS else (x,)
    for tensor in inputs:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter) or tensor.dtype is not torch.float32 \
                or not tensor.is_cpu or not tensor.is_contiguous() \
                or (tensor.requires_grad and torch.is_grad_enabled()):
            return None
    n = x.numel()
    if not n or rows < 1 or n % rows or (len(inputs) == 2 and y.numel() != n) \
            or torch.compiler.is_compiling():
        return None
    out = torch.empty(rows, dtype=torch.float32, device="cpu")
    _native.reduce_f32(x.data_ptr(), y.data_ptr() if len(inputs) == 2 else 0, rows, n // rows, kind,
                       out.data_ptr(), _threads())
    return out


_REDUCED = (torch.float16, torch.bfloat16)
_CONVERSION_ELEMENTS_PER_THREAD = 1 << 22


def _convertible(x: torch.Tensor, dtype: torch.dtype) -> bool:
    """Whether the compiled conversion applies to ``x``: a plain host tensor of one reduced type
    (not nested) that autograd does not record (a copy would not be on its graph), converted to
    the other, outside torch.compile's tracing. Subclasses and wrappers (traced, batched, fake)
    are torch's to convert."""
    return type(x) in (torch.Tensor, torch.nn.Parameter) and x.is_cpu \
        and x.layout is torch.strided and not x.is_nested and x.dtype in _REDUCED and dtype in _REDUCED \
        and x.dtype is not dtype and not (x.requires_grad and torch.is_grad_enabled()) \
        and not torch.compiler.is_compiling()


def dense(x: torch.Tensor) -> bool:
    """Whether ``x``'s elements fill the memory from its first one without gap or overlap, in
    some order of its dimensions: row-major, channels-last, or permuted (attention's output is
    laid out batch, position, head while its sizes read batch, head, position). The conversion
    then takes that memory whole, element k of it to element k of a tensor of the same strides."""
    if x.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted(zip(x.stride(), x.size())):
        if size != 1:                                   # a dimension of one has any stride
            if stride != expected:
                return False
            expected *= size
    return True


def dense_strides(x: torch.Tensor) -> tuple:
    """The strides of a tensor of ``x``'s sizes whose elements fill its memory in the order
    ``x``'s dimensions lie in memory (the largest stride outermost), as ``torch.empty_like``
    lays out a copy of a tensor that is not dense: a head split off a fused projection is
    staged in the layout it came in, and what is computed from it is laid out as from it."""
    given, sizes = x.stride(), x.size()
    strides = [0] * len(given)
    expected = 1
    for dimension in sorted(range(len(given)), key=given.__getitem__):
        strides[dimension] = expected
        expected *= sizes[dimension]
    return tuple(strides)


def _convert(source: int, destination: int, x: torch.Tensor, dtype: torch.dtype) -> bool:
    # One thread below 2^22 elements: a conversion is so little work a value that starting a
    # thread costs more than it saves (2^21 elements: 85 us on one, 118 on two, AVX-512 EPYC).
    threads = _threads() if x.numel() >= _CONVERSION_ELEMENTS_PER_THREAD else 1
    return _native.convert_reduced(source, destination, x.numel(), dtype is torch.bfloat16, threads)


def reduced_converted(x: torch.Tensor, dtype: torch.dtype,
                      out: Optional[torch.Tensor] = None) -> Optional[torch.Tensor]:
    """``x`` (float16 or bfloat16) in the other of the two, converted in one pass: the values
    torch's ``x.to(dtype)`` gives (a NaN stays a NaN), in a tensor of the same strides, or
    ``out`` where given (of ``dtype``, ``x``'s sizes and strides; ``x`` dense). A tensor that is
    not dense (a head split off a fused projection) is first copied densely, in its own type
    and in the order of its dimensions in memory (``clone``'s layout).
    None where the CPU has no F16C or the conversion does not apply (``_convertible``): torch
    converts those."""
    if not _convertible(x, dtype):
        return None
    if not dense(x):
        return None if out is not None else reduced_converted_in_place(x.clone(), dtype, frozenset())
    try:
        source = x.data_ptr()
    except RuntimeError:                            # a wrapper with no storage of its own
        return None
    if out is None:
        out = torch.empty_like(x, dtype=dtype)      # the same strides: element k to element k
    return out if _convert(source, out.data_ptr(), x, dtype) else None


def converted_into(x: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> bool:
    """``x`` converted into ``out`` (``out`` may be ``x``): both dense host tensors of the same
    strides, one reduced type to the other, as the caller has checked (the precision policy's
    kept buffers, on every call: ``reduced_converted``'s checks cost more than converting a
    small operand). False, and nothing converted, where the CPU has no F16C."""
    return _convert(x.data_ptr(), out.data_ptr(), x, dtype)


def converted_transposed_into(x: torch.Tensor, out: torch.Tensor, dtype: torch.dtype,
                              matrices: int, rows: int, cols: int) -> bool:
    """``x``'s memory read as ``matrices`` rows x cols matrices, one reduced type converted to
    the other into ``out``'s, each matrix transposed (cols x rows): a channel-first activation
    to channels-last (rows: its channels; cols: its positions) or back, in one pass where torch
    takes a permuting copy and a conversion. Both dense host tensors of ``matrices * rows * cols``
    elements that do not overlap, as the caller has checked. On one thread: a second one
    contends with torch's own, which spin for a while after each of its parallel regions (a
    float16 convnet ran 1.3x as long with these on two threads, 2-CPU Xeon). False, and
    nothing converted, where the CPU has no F16C and AVX2."""
    return _native.convert_reduced_transposed(x.data_ptr(), out.data_ptr(), matrices, rows, cols,
                                              dtype is torch.bfloat16, 1)


def reduced_converted_in_place(x: torch.Tensor, dtype: torch.dtype,
                               operands: frozenset) -> Optional[torch.Tensor]:
    """``x`` (dense) converted as by ``reduced_converted`` but where it lies, returned as a
    tensor of ``dtype`` over the same memory (a plain tensor, not a view of ``x``), which ``x``
    must no longer be used as: no second buffer, whose first touch costs a page fault every
    4 KiB. For the result of a call that nothing else holds: None, and nothing converted, where
    its storage is among ``operands`` (the data pointers of the storages the call was given) or
    the conversion does not apply."""
    if not _convertible(x, dtype) or not dense(x):
        return None
    try:
        storage = x.untyped_storage()
        source = x.data_ptr()
    except RuntimeError:
        return None
    if storage.data_ptr() in operands or not _convert(source, source, x, dtype):
        return None
    # Of the same element size, ``view(dtype)`` is the same memory in the other type, and no view
    # for autograd (no ``_base``, on every torch from 2.4): a quarter of the cost of a fresh
    # tensor set onto the storage.
    return x.view(dtype)
