"""Kernels the target lacks where CUDA has them: wider dtypes, and CUDA-only ops torch calls.

Dtype gaps: the table (``tables/dtype_gaps.py``) is the CPU's, generated from torch's
operator database, with the gaps other releases have beyond it (``dtype_gaps_by_release.py``:
torch 2.4 has no float16 grid_sample on the CPU); other targets' gaps are not known there, so
dtypes are filled only on the CPU. Each function with a gap (and its Tensor methods) is wrapped; no other op is
touched.

Missing ops: torch itself calls some ops only CUDA implements (on accelerators the fused LSTM
and GRU cells; on any device SyncBatchNorm's statistics: ``kernels/cuda_only_ops.py``).
Where the target's dispatch key has no kernel for one, cudashim's portable kernel is
registered for it, and the registration is removed on deactivation. Ops an accelerator
lacks but the host has are its own host fallback's to run (``cudashim doctor --kernels``
lists them).
"""

from __future__ import annotations

import functools
import importlib
from typing import List, Optional

import torch

from ..kernels import cuda_only_ops
from ..kernels.gap_fill import filled
from ..patching.rewriter import compiled_twin
from ..patching.when_imported import WhenImported
from ..tables.dtype_gaps import GAPS, GENERATED_ON
from ..tables.dtype_gaps_by_release import BEYOND
from ..torch_range import nearest


def gaps_of(version: str) -> dict:
    """{torch function: (dtype names, Tensor methods)}: the main table's gaps, with those of the
    releases ``version`` is nearest to among the ones the tables were made on."""
    table = {name: (set(dtypes), set(methods)) for name, (dtypes, methods) in GAPS.items()}
    for release in nearest(version, (*BEYOND, GENERATED_ON)):
        for name, (dtypes, methods) in BEYOND.get(release, {}).items():
            known = table.setdefault(name, (set(), set()))
            known[0].update(dtypes)
            known[1].update(methods)
    return {name: (tuple(sorted(dtypes)), tuple(sorted(methods))) for name, (dtypes, methods) in table.items()}


def gaps():
    """[(owner, attribute, dtypes, Tensor methods)] for every gap this torch has."""
    found = []
    for name, (dtype_names, methods) in gaps_of(torch.__version__).items():
        module_name, _, attribute = f"torch.{name}".rpartition(".")
        owner = importlib.import_module(module_name)
        dtypes = frozenset(getattr(torch, d) for d in dtype_names)
        if hasattr(owner, attribute):
            found.append((owner, attribute, dtypes, methods))
    return found


def dispatch_key(device_type: str) -> Optional[str]:
    """The dispatch key a target's kernels are registered for, or None (CUDA itself, or a
    device type the dispatcher has no key of its own for)."""
    if device_type == torch._C._get_privateuse1_backend_name():
        return "PrivateUse1"
    key = device_type.upper()
    if key == "CUDA" or not hasattr(torch._C.DispatchKey, key):
        return None
    return key


def missing_ops(device_type: str) -> List[str]:
    """The CUDA-only ops torch calls that ``device_type`` has no kernel for."""
    key = dispatch_key(device_type)
    if key is None:
        return []
    return [name for name in cuda_only_ops.OPS
            if not torch._C._dispatch_has_kernel_for_dispatch_key(f"aten::{name}", key)]


# What each bitsandbytes feature CUDA programs use runs on: its ops, by name. bitsandbytes
# registers kernels per device, plus "default" ones in torch operations for any device.
BITSANDBYTES_FEATURES = {
    "8-bit layers (load_in_8bit, Linear8bitLt)": (
        "int8_vectorwise_quant", "int8_linear_matmul", "int8_mm_dequant"),
    "4-bit layers (load_in_4bit, Linear4bit)": ("quantize_4bit", "dequantize_4bit", "gemv_4bit"),
    "8-bit optimizers (Adam8bit, AdamW8bit, PagedAdamW8bit, ...)": ("optimizer_update_8bit_blockwise",),
}
_ANY_DEVICE_KEYS = ("CompositeExplicitAutograd", "CompositeImplicitAutograd")


def bitsandbytes_gaps(device_type: str) -> dict:
    """{feature: the ops bitsandbytes has no kernel for on ``device_type``}, for the features
    that cannot run there (bitsandbytes imported; empty on CUDA)."""
    key = dispatch_key(device_type)
    if key is None:
        return {}
    defined = {name.partition(".")[0] for name in torch._C._dispatch_get_all_op_names()
               if name.startswith("bitsandbytes::")}
    gaps = {}
    for feature, ops in BITSANDBYTES_FEATURES.items():
        if not all(f"bitsandbytes::{op}" in defined for op in ops):
            continue                 # a bitsandbytes without these ops: its own way, not ours to judge
        missing = [op for op in ops if not any(
            torch._C._dispatch_has_kernel_for_dispatch_key(f"bitsandbytes::{op}", k)
            for k in (key, *_ANY_DEVICE_KEYS))]
        if missing:
            gaps[feature] = missing
    return gaps


def install(activation):
    device_type = activation.backend.device_type
    if device_type == "cpu":
        _fill_dtype_gaps(activation)
    missing = missing_ops(device_type)
    if missing:
        _register_portable_kernels(activation, device_type, missing)


def _say_bitsandbytes_gaps(device_type, bitsandbytes) -> None:
    """One warning, when bitsandbytes is imported (before any model is loaded), naming what of
    it has no kernel on the target."""
    from ..errors import warn_once

    gaps = bitsandbytes_gaps(device_type)
    if gaps:
        features = "; ".join(f"{feature} (bitsandbytes::{', '.join(ops)})" for feature, ops in gaps.items())
        warn_once(f"bitsandbytes-gaps-{device_type}",
                  f"bitsandbytes {getattr(bitsandbytes, '__version__', '')} has no kernel on "
                  f"{device_type} for: {features}. These fail where the program uses them; its "
                  f"other features run on bitsandbytes' kernels in torch operations")


WHEN_IMPORTED = (WhenImported("bitsandbytes", lambda activation, module: _say_bitsandbytes_gaps(
    activation.backend.device_type, module)),)


def _fill_dtype_gaps(activation):
    def fill(original, dtypes, inplace_of=None):
        python = filled(original, dtypes, inplace_of)
        if activation.compiled is None:
            return python
        # Calls outside the gap, nearly all of them, skip the Python frame.
        gate = activation.compiled.DtypeGate(original, python.widened, tuple(dtypes), torch._C.TensorBase)
        gate = compiled_twin(gate, python)
        gate.cudashim_gap_dtypes = python.cudashim_gap_dtypes
        return gate

    for owner, attribute, dtypes, methods in gaps():
        activation.replace(owner, attribute, lambda original, d=dtypes: fill(original, d))
        for method in methods:
            inplace_of = getattr(torch.Tensor, method[:-1]) if method.endswith("_") else None
            activation.replace(torch.Tensor, method,
                               lambda original, d=dtypes, o=inplace_of: fill(original, d, o))


def _register_portable_kernels(activation, device_type, names):
    library = torch.library.Library("aten", "IMPL")
    activation.registry.add_undo(f"portable kernels for CUDA-only ops on {device_type}",
                                 library._destroy)
    for name in names:
        kernel = cuda_only_ops.OPS[name]
        if activation.reporting:
            kernel = _counted(kernel, f"aten::{name}", f"cudashim's portable kernel on {device_type}",
                              activation.count)
        library.impl(name, kernel, dispatch_key(device_type))


def _counted(kernel, api, became, count):
    @functools.wraps(kernel)
    def counted(*args, **kwargs):
        count(api, became)
        return kernel(*args, **kwargs)
    return counted
