"""Stand-ins for the CUDA-only libraries CUDA programs import, served only where the real
package cannot work on the target.

A program is often CUDA-only because of an import (``from flash_attn import flash_attn_func``,
``from apex.optimizers import FusedAdam``, ``import pynvml``): off CUDA the package is absent,
fails to load its CUDA library, or loads and fails at its first call. ``finder.py`` is the
import hook that decides, per library, at its first import: the real package is imported
first and tried on the target (``probes.py``); if it is absent, fails to import or fails the
try, the stand-in in this folder is served under the real name. Each stand-in is built on
torch's own operations (``scaled_dot_product_attention``, ``torch.optim``, ``torch.amp``,
``torch.nn.LayerNorm``), so it runs on every target.

``LIBRARIES`` is the one table: ``--substitute`` checks names against it, the finder serves
from it, ``doctor`` and ``cudashim scan`` read it. This module imports no torch.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Dict, Tuple

HERE = Path(__file__).resolve().parent
# The version suffix every stand-in's metadata carries: a PEP 440 local label, so version
# checks (">= 2.3.3") pass and the installed "package" still says what it is.
LOCAL_VERSION = "cudashim"


@dataclasses.dataclass(frozen=True)
class Library:
    name: str                        # the --substitute name (the main import name)
    modules: Tuple[str, ...]         # top-level import names it serves
    distribution: str                # the distribution name its metadata answers to
    version: str                     # the upstream API version the stand-in follows
    substituted: str                 # what the stand-in covers (named in its refusals)

    @property
    def full_version(self) -> str:
        return f"{self.version}+{LOCAL_VERSION}"


LIBRARIES: Dict[str, Library] = {library.name: library for library in (
    Library("flash_attn", ("flash_attn",), "flash_attn", "2.8.3",
            "flash_attn_func, its qkv/kv-packed and varlen variants, flash_attn_with_kvcache "
            "(causal, softmax_scale, dropout_p, window_size, softcap, alibi_slopes, "
            "return_attn_probs, paged KV), flash_attn.bert_padding, flash_attn.layers.rotary, "
            "on scaled_dot_product_attention"),
    Library("xformers", ("xformers",), "xformers", "0.0.32",
            "xformers.ops.memory_efficient_attention with LowerTriangularMask, BlockDiagonalMask "
            "(and its causal, local and bottom-right variants), tensor biases, fmha op names, "
            "on scaled_dot_product_attention"),
    Library("apex", ("apex", "amp_C"), "apex", "0.1",
            "apex.optimizers (FusedAdam, FusedSGD, FusedAdagrad on torch.optim; FusedLAMB, "
            "FusedNovoGrad written here), apex.normalization, apex.amp on torch.amp, "
            "apex.parallel.DistributedDataParallel on torch's DDP, amp_C's l2norm/scale/axpby "
            "through apex.multi_tensor_apply"),
    Library("pynvml", ("pynvml",), "nvidia-ml-py", "12.575.51",
            "nvmlInit/Shutdown, device count, handles, name, UUID, memory, utilization, "
            "temperature, power, driver and CUDA versions, running processes, answered by "
            "the target"),
)}


def names() -> Tuple[str, ...]:
    return tuple(LIBRARIES)


def library_of(module: str):
    """The Library that serves the top-level import name of ``module``, or None."""
    top = module.partition(".")[0]
    for library in LIBRARIES.values():
        if top in library.modules:
            return library
    return None


def source_of(module: str) -> Path:
    """The stand-in's file for a top-level import name: a package's ``__init__.py`` or a
    module file."""
    package = HERE / module / "__init__.py"
    return package if package.exists() else HERE / f"{module}.py"


def provides(module: str) -> bool:
    """Whether the stand-ins have a file for the dotted module name (``flash_attn.bert_padding``)."""
    path = HERE.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()

