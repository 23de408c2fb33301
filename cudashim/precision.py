"""The precision policy: what CUDA's precision requests compute in on the target.

CUDA programs ask for float16 because NVIDIA GPUs compute it fast (autocast's default,
``model.half()``), and set the TF32 flags because TF32 makes float32 matmuls fast. Both are
requests for speed, and on a target that computes float16 slowly (a CPU without AVX512-FP16
or AMX-FP16 converts element by element, tens of times slower than float32; one with AVX512-FP16
and not AMX-FP16 computes float16 products at float32's speed, a third of AMX-BF16's) taking them
literally defeats them. So, by default (``amp_dtype="auto"``):

- an autocast region asked for a dtype the target computes slowly runs in one it computes
  fast: float16 becomes bfloat16 where bfloat16 is fast, else the region runs in float32
  (autocast off; the matmul family computes the float16 and bfloat16 tensors the program
  made there in float32, where autocast would have cast them); a bfloat16 request never
  becomes float16, whose range is narrower;
- tensors the program made float16 stay float16, and the matmul family computes them in
  what the host computes fastest for the call's shape class (``patches/precision.py``):
  as asked, in bfloat16, or in float32, each rounded back to float16 once. Memory-bound calls
  (a few rows a matrix: decoding a batch of 1-4) read their weights more than they compute,
  so float16's half-size weights can beat float32 even where float16 arithmetic is emulated;
  compute-bound ones (training, prefill) run at the arithmetic's speed. The host measures
  both classes once (``MatmulChoices``, cached on disk), at the first activation that needs
  them, and attention's two (a decoding step's query over a cache, a prefill) on attention
  itself;
- the other ops a float16 model runs (normalization, softmax, pooling, GELU, resampling) are
  mostly memory-bound, and as asked they often beat float32, which costs a conversion each way:
  each is timed both ways on the host once (``tables/float16_ops.py``, cached beside the matmul
  table) and computed in float32 only where that measured faster;
- the TF32 flags turn on the target's reduced-precision float32 matmul where it has one
  (oneDNN's bfloat16 precision on CPUs that compute bfloat16 fast).

``amp_dtype="as-asked"`` (and ``tf32="ignore"``) keep every request literal.
"""

from __future__ import annotations

import functools
import threading
import types
from typing import Callable, Dict, List, Mapping, NamedTuple, Optional

import torch

from . import torch_names

AS_ASKED, BFLOAT16, FLOAT32 = "as-asked", "bfloat16", "float32"
# What each choice computes a float16 request in; None: autocast off (float32).
_AUTOCAST_DTYPE = {AS_ASKED: torch.float16, BFLOAT16: torch.bfloat16, FLOAT32: None}
# What each choice costs in precision, against CUDA's float16 (README, "Precision").
PRECISION_COST = {
    AS_ASKED: "float16 as CUDA computes it (float32 accumulation, one rounding)",
    BFLOAT16: "inputs rounded to bfloat16's 8-bit significand (3 bits fewer than float16's 11; "
              "relative error up to 2^-9 per element), float32 accumulation, one rounding to float16",
    FLOAT32: "inputs exact in float32, float32 arithmetic, one rounding to float16: "
             "at least as close as CUDA's",
}


class MatmulChoices(NamedTuple):
    """What a float16 matmul computes in, per shape class, on this target."""
    memory_bound: str                   # AS_ASKED, BFLOAT16 or FLOAT32
    compute_bound: str
    memory_bound_rows: int              # a product of at most this many rows a matrix is memory-bound
    how_known: str
    # What the choices were measured from: {shape class: {choice: ms, "rows": rows}}, and for a
    # class timed on weights streamed from memory, "streamed": how many.
    timings: Mapping[str, Mapping[str, float]] = types.MappingProxyType({})
    # Attention's own choices (scaled_dot_product_attention, measured on its own shapes: a
    # decoding step is one query over a cache, a prefill as many queries as positions); None:
    # as the products'.
    attention: Optional["MatmulChoices"] = None

    def of_attention(self) -> "MatmulChoices":
        """The choices attention computes in."""
        return self.attention if self.attention is not None else self

    def is_memory_bound(self, rows: Optional[int]) -> bool:
        """Whether a product of ``rows`` rows a matrix is memory-bound (None: not known, no)."""
        return rows is not None and rows <= self.memory_bound_rows

    def for_rows(self, rows: Optional[int]) -> str:
        """The choice for a product with ``rows`` rows a matrix."""
        return self.memory_bound if self.is_memory_bound(rows) else self.compute_bound

    @classmethod
    def from_dtype_speeds(cls, fast: Dict[torch.dtype, bool], how_known: str) -> "MatmulChoices":
        """Where nothing is measured: one choice for both classes, from the dtypes' speeds."""
        choice = AS_ASKED if fast.get(torch.float16, True) else \
            BFLOAT16 if fast.get(torch.bfloat16, False) else FLOAT32
        return cls(choice, choice, 0, how_known)


class Float32Regions(threading.local):
    """How deep this thread is in CUDA autocast regions that run in float32 (autocast off):
    the amp group counts them, the precision group computes mixed dtypes there in float32."""
    depth = 0


class PrecisionPolicy:
    """What CUDA's precision requests compute in on one target, under one setting.

    A plain class, not a dataclass: it is built at every activation, and a dataclass compiles
    its generated methods when its module is imported, a millisecond of every start-up."""

    def __init__(self, amp_dtype: str, tf32: str, device_type: str, fast: Dict[torch.dtype, bool],
                 how_known: str, measure_matmuls: Optional[Callable[[], MatmulChoices]] = None,
                 measure_ops: Optional[Callable[[], Dict[str, dict]]] = None):
        self.amp_dtype = amp_dtype           # the setting: auto, as-asked, bfloat16, float16
        self.tf32 = tf32                     # the setting: auto, ignore
        self.device_type = device_type
        self.fast = fast                     # which reduced-precision dtypes the target computes fast
        self.how_known = how_known
        self.float32_regions = Float32Regions()
        # Measures (or looks up) the float16 matmul choices; asked once, when first needed.
        self.measure_matmuls = measure_matmuls
        # Times (or looks up) the other float16 ops both ways; asked once, when first needed.
        self.measure_ops = measure_ops

    def __repr__(self):
        return (f"PrecisionPolicy(amp_dtype={self.amp_dtype!r}, tf32={self.tf32!r}, "
                f"device_type={self.device_type!r}, fast={self.fast!r}, how_known={self.how_known!r})")

    @classmethod
    def of(cls, backend, settings) -> "PrecisionPolicy":
        fast, how_known = backend.dtype_speeds()
        return cls(settings.amp_dtype, settings.tf32, backend.device_type, dict(fast), how_known,
                   measure_matmuls=backend.float16_matmul_choices,
                   measure_ops=backend.float16_op_choices)

    @functools.cached_property
    def float16_matmuls(self) -> MatmulChoices:
        """What explicit float16 matmuls compute in, by shape class. The auto setting measures
        where float16 is slow; "bfloat16" computes them in float32, as it always did."""
        if self.amp_dtype == "auto" and not self.fast.get(torch.float16, True):
            if self.measure_matmuls is None:
                return MatmulChoices.from_dtype_speeds(self.fast, self.how_known)
            return self.measure_matmuls()
        if self.widens_float16:
            return MatmulChoices(FLOAT32, FLOAT32, 0, f"--amp-dtype {self.amp_dtype}")
        return MatmulChoices(AS_ASKED, AS_ASKED, 0, self.how_known)

    @functools.cached_property
    def float16_ops(self) -> Dict[str, dict]:
        """The float16 ops outside the matmul family, timed as asked and in float32 on the host
        ({op: {"choice": ..., "as-asked": ms, "float32": ms}}): where float16 is slow under
        the auto setting; empty elsewhere (every op as asked)."""
        if self.amp_dtype != "auto" or not self.widens_float16 or self.measure_ops is None:
            return {}
        return self.measure_ops()

    @property
    def widened_ops(self) -> List[str]:
        """The float16 ops outside the matmul family computed in float32 (measured faster)."""
        return [name for name, measured in self.float16_ops.items() if measured["choice"] == FLOAT32]

    def autocast_dtype(self, asked: torch.dtype) -> Optional[torch.dtype]:
        """The dtype a CUDA autocast region asked for ``asked`` runs in; None: float32.

        A slow float16 region runs in the compute-bound choice of the matmul family: autocast
        casts the weights at each call, so a region's matmuls read float32 weights whatever
        they compute in, and the memory-bound gain of float16 weights is not to be had."""
        if self.amp_dtype == "as-asked":
            return asked
        if self.amp_dtype != "auto":
            return getattr(torch, self.amp_dtype)
        if self.fast.get(asked, True):
            return asked
        if asked == torch.float16:
            measured = _AUTOCAST_DTYPE[self.float16_matmuls.compute_bound]
            if measured is not torch.bfloat16 or self.fast.get(torch.bfloat16, False):
                return measured
        return None

    @property
    def widens_float16(self) -> bool:
        """Whether float16 matmuls are computed by the policy (float16 is slow, and not asked
        for): the matmul family is patched, and each call computes in its shape class's choice."""
        return self.amp_dtype in ("auto", "bfloat16") and not self.fast.get(torch.float16, True)

    @property
    def float32_matmul_precision(self) -> Optional[str]:
        """What the TF32 flags map to on the target: oneDNN's "bf16" on CPUs that compute
        bfloat16 fast; None where the target has no reduced-precision float32 matmul."""
        if self.tf32 != "auto" or self.device_type != "cpu":
            return None
        if not torch_names.has("torch.backends.mkldnn.matmul.fp32_precision"):
            return None                 # a torch without oneDNN's float32 precision setting
        return "bf16" if self.fast.get(torch.bfloat16, False) else None

    def describe(self) -> List[str]:
        """What ``cudashim doctor`` prints."""
        def speed(dtype):
            return "fast" if self.fast.get(dtype, True) else "slow"

        def name(dtype):
            return "float32 (autocast off)" if dtype is None else str(dtype).replace("torch.", "")

        lines = [f"float16: {speed(torch.float16)}, bfloat16: {speed(torch.bfloat16)} "
                 f"({self.how_known})",
                 f"CUDA autocast: float16 runs in {name(self.autocast_dtype(torch.float16))}, "
                 f"bfloat16 in {name(self.autocast_dtype(torch.bfloat16))} "
                 f"(--amp-dtype {self.amp_dtype}; also autocast on '{self.device_type}' itself)"]
        lines += self.matmul_table()
        lines += self.op_table()
        mapped = self.float32_matmul_precision
        lines.append("TF32 flags: " + (f"oneDNN {mapped} precision for float32 matmuls" if mapped
                                       else "no reduced-precision float32 matmul on this target"
                                       if self.tf32 == "auto" else "ignored (--tf32 ignore)"))
        return lines

    def matmul_table(self) -> List[str]:
        """The float16 matmul choices, one line per shape class, with what they were chosen from."""
        if not self.widens_float16:
            return ["explicit float16 matmuls: as they are"]
        choices = self.float16_matmuls
        described = {AS_ASKED: "in float16, as asked", BFLOAT16: "in bfloat16, rounded to float16 once",
                     FLOAT32: "in float32, rounded to float16 once"}

        def measured(choices, shape_class):
            times = choices.timings.get(shape_class)
            if not times:
                return ""
            streamed = f", each weight read among {times['streamed']}" if "streamed" in times else ""
            return " [" + ", ".join(f"{choice} {ms:.3g} ms" for choice, ms in times.items()
                                    if choice in described) + f" at {times.get('rows')} rows{streamed}]"
        lines = [f"explicit float16 matmuls ({choices.how_known}):",
                 f"  memory-bound (at most {choices.memory_bound_rows} rows a matrix): "
                 f"{described[choices.memory_bound]}{measured(choices, 'memory-bound')}",
                 f"  compute-bound: {described[choices.compute_bound]}{measured(choices, 'compute-bound')}"]
        if BFLOAT16 in (choices.memory_bound, choices.compute_bound) and self.device_type == "cpu":
            from .kernels import packed_convolution, packed_encoder_layer, packed_linear
            why_not = packed_linear.unavailable()
            lines.append("  linear layers in bfloat16: " + (
                "weights kept packed for oneDNN, packed once (torch's own bfloat16 linear reorders them "
                "at every call)" if why_not is None else f"weights kept in torch's layout ({why_not})"))
            why_not = packed_convolution.unavailable()
            lines.append("  conv1d and conv2d layers in bfloat16: " + (
                "weights kept packed for oneDNN's channels-last kernels, activations converted and laid "
                "out in one pass each way, where that times faster than torch's own at the first call of "
                "each layer's sizes" if why_not is None else f"weights kept in torch's layout ({why_not})"))
            why_not = packed_convolution.volumetric_unavailable()
            lines.append("  conv3d layers in bfloat16: " + (
                "as conv2d's" if why_not is None else f"weights kept in torch's layout ({why_not})"))
            why_not = packed_convolution.transposed_unavailable()
            lines.append("  conv_transpose1d and conv_transpose2d layers in bfloat16: " + (
                "as conv2d's" if why_not is None else f"weights kept in torch's layout ({why_not})"))
            why_not = packed_convolution.volumetric_transposed_unavailable()
            lines.append("  conv_transpose3d layers in bfloat16: " + (
                "as conv2d's" if why_not is None else f"weights kept in torch's layout ({why_not})"))
            why_not = packed_encoder_layer.unavailable()
            lines.append("  fused attention layers in bfloat16 (nn.TransformerEncoderLayer, nn.MultiheadAttention): " + (
                "computed op by op on weights kept packed, a padded batch's tokens as one matrix"
                if why_not is None else f"torch's fused call on plain copies ({why_not})"))
        attention = choices.attention
        if attention is not None:
            lines += [f"float16 attention (scaled_dot_product_attention, {attention.how_known}):",
                      f"  decoding (at most {attention.memory_bound_rows} queries a head): "
                      f"{described[attention.memory_bound]}{measured(attention, 'memory-bound')}",
                      f"  prefill: {described[attention.compute_bound]}{measured(attention, 'compute-bound')}"]
        return lines

    def op_table(self) -> List[str]:
        """The other float16 ops: which run as asked and which in float32, with their timings."""
        if not self.float16_ops:
            return []

        from .tables.float16_ops import ONLY_WHEN

        def timed(names):
            return ", ".join(f"{name} ({AS_ASKED} {measured[AS_ASKED]:.3g} ms, {FLOAT32} {measured[FLOAT32]:.3g} ms"
                             f"{_widened_sizes(measured) if name in widened else ''}"
                             f"{'; ' + ONLY_WHEN[name][1] if name in widened and name in ONLY_WHEN else ''})"
                             for name, measured in self.float16_ops.items() if name in names)
        widened = self.widened_ops
        kept = [name for name in self.float16_ops if name not in widened]
        lines = ["other float16 ops (timed on this CPU as the matmuls are, float32 with its two conversions):"]
        if kept:
            lines.append(f"  as asked: {timed(kept)}")
        if widened:
            lines.append(f"  in float32, rounded to float16 once: {timed(widened)}")
        return lines


def _widened_sizes(measured: dict) -> str:
    """For doctor: the input sizes a widened op runs in float32 at, and the grown timing that
    set the bound."""
    grown = sorted(measured.get("grown") or ())
    up_to = measured.get("widened_up_to")
    if up_to is None:
        if not grown:
            return ""
        elements, asked, widened = grown[-1]
        return f"; at every size: at {elements:,} elements {AS_ASKED} {asked:.3g} ms, {FLOAT32} {widened:.3g} ms"
    beyond = next((timing for timing in grown if timing[0] > up_to), None)
    said = f"; up to {up_to:,} elements, as asked beyond"
    if beyond is not None:
        elements, asked, widened = beyond
        said += f" (at {elements:,}: {AS_ASKED} {asked:.3g} ms, {FLOAT32} {widened:.3g} ms)"
    return said
