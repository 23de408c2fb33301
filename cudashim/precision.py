"""The precision policy: what CUDA's precision requests compute in on the target.

CUDA programs ask for float16 because NVIDIA GPUs compute it fast (autocast's default,
``model.half()``), and set the TF32 flags because TF32 makes float32 matmuls fast. Both are
requests for speed, and on a target that computes float16 slowly (a CPU without AVX512-FP16
or AMX-FP16 converts element by element, tens of times slower than float32) taking them
literally defeats them. So, by default (``amp_dtype="auto"``):

- an autocast region asked for a dtype the target computes slowly runs in one it computes
  fast: float16 becomes bfloat16 where bfloat16 is fast, else the region runs in float32
  (autocast off; the matmul family computes the float16 and bfloat16 tensors the program
  made there in float32, where autocast would have cast them); a bfloat16 request never
  becomes float16, whose range is narrower;
- tensors the program made float16 stay float16, and the matmul family computes them in
  float32 and rounds once (``patches/precision.py``);
- the TF32 flags turn on the target's reduced-precision float32 matmul where it has one
  (oneDNN's bfloat16 precision on CPUs that compute bfloat16 fast).

``amp_dtype="as-asked"`` (and ``tf32="ignore"``) keep every request literal.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Dict, List, Optional

import torch


class Float32Regions(threading.local):
    """How deep this thread is in CUDA autocast regions that run in float32 (autocast off):
    the amp group counts them, the precision group computes mixed dtypes there in float32."""
    depth = 0


@dataclasses.dataclass(frozen=True)
class PrecisionPolicy:
    amp_dtype: str                       # the setting: auto, as-asked, bfloat16, float16
    tf32: str                            # the setting: auto, ignore
    device_type: str
    fast: Dict[torch.dtype, bool]        # which reduced-precision dtypes the target computes fast
    how_known: str
    float32_regions: Float32Regions = dataclasses.field(default_factory=Float32Regions, compare=False,
                                                        repr=False)

    @classmethod
    def of(cls, backend, settings) -> "PrecisionPolicy":
        fast, how_known = backend.dtype_speeds()
        return cls(settings.amp_dtype, settings.tf32, backend.device_type, dict(fast), how_known)

    def autocast_dtype(self, asked: torch.dtype) -> Optional[torch.dtype]:
        """The dtype a CUDA autocast region asked for ``asked`` runs in; None: float32."""
        if self.amp_dtype == "as-asked":
            return asked
        if self.amp_dtype != "auto":
            return getattr(torch, self.amp_dtype)
        if self.fast.get(asked, True):
            return asked
        if asked == torch.float16 and self.fast.get(torch.bfloat16, False):
            return torch.bfloat16
        return None

    @property
    def widens_float16(self) -> bool:
        """Whether float16 matmuls compute in float32 (float16 is slow, and not asked for)."""
        return self.amp_dtype in ("auto", "bfloat16") and not self.fast.get(torch.float16, True)

    @property
    def float32_matmul_precision(self) -> Optional[str]:
        """What the TF32 flags map to on the target: oneDNN's "bf16" on CPUs that compute
        bfloat16 fast; None where the target has no reduced-precision float32 matmul."""
        if self.tf32 != "auto" or self.device_type != "cpu":
            return None
        return "bf16" if self.fast.get(torch.bfloat16, False) else None

    def describe(self) -> List[str]:
        """What ``cudashim doctor`` prints."""
        def speed(dtype):
            return "fast" if self.fast.get(dtype, True) else "slow (emulated)"

        def name(dtype):
            return "float32 (autocast off)" if dtype is None else str(dtype).replace("torch.", "")

        lines = [f"float16: {speed(torch.float16)}, bfloat16: {speed(torch.bfloat16)} "
                 f"({self.how_known})",
                 f"CUDA autocast: float16 runs in {name(self.autocast_dtype(torch.float16))}, "
                 f"bfloat16 in {name(self.autocast_dtype(torch.bfloat16))} "
                 f"(--amp-dtype {self.amp_dtype})",
                 "explicit float16 matmuls: " + ("computed in float32, rounded once"
                                                 if self.widens_float16 else "as they are")]
        mapped = self.float32_matmul_precision
        lines.append("TF32 flags: " + (f"oneDNN {mapped} precision for float32 matmuls" if mapped
                                       else "no reduced-precision float32 matmul on this target"
                                       if self.tf32 == "auto" else "ignored (--tf32 ignore)"))
        return lines
