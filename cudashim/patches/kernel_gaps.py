"""Dtypes the target's kernels lack where CUDA's have them are computed in a wider dtype.

The table (``kernels/dtype_gaps.py``) is the CPU's, generated from torch's operator
database; other targets' gaps are not known there, so this group fills only on the CPU.
Each function with a gap (and its Tensor methods) is wrapped; no other op is touched.
"""

import importlib

import torch

from ..kernels.dtype_gaps import GAPS
from ..kernels.gap_fill import filled


def gaps():
    """[(owner, attribute, dtypes, Tensor methods)] for every gap this torch has."""
    found = []
    for name, (dtype_names, methods) in GAPS.items():
        module_name, _, attribute = f"torch.{name}".rpartition(".")
        owner = importlib.import_module(module_name)
        dtypes = frozenset(getattr(torch, d) for d in dtype_names)
        if hasattr(owner, attribute):
            found.append((owner, attribute, dtypes, methods))
    return found


def install(activation):
    if activation.backend.device_type != "cpu":
        return
    for owner, attribute, dtypes, methods in gaps():
        activation.replace(owner, attribute, lambda original, d=dtypes: filled(original, d))
        for method in methods:
            inplace_of = getattr(torch.Tensor, method[:-1]) if method.endswith("_") else None
            activation.replace(torch.Tensor, method,
                               lambda original, d=dtypes, o=inplace_of: filled(original, d, o))
