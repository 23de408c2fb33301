"""The legacy CUDA tensor and storage type names (``torch.cuda.FloatTensor``, ...).

One table, read by the proxy ``torch.cuda`` (which builds the classes) and by the patches
that take them as values (``t.type(torch.cuda.FloatTensor)``, ``t.type()`` answering a CUDA
name, ``torch.set_default_tensor_type(torch.cuda.HalfTensor)``).
"""

from __future__ import annotations

import torch

# The element type each legacy prefix stands for.
DTYPES = {
    "BFloat16": torch.bfloat16, "Bool": torch.bool, "Byte": torch.uint8, "Char": torch.int8,
    "Double": torch.float64, "Float": torch.float32, "Half": torch.float16,
    "Int": torch.int32, "Long": torch.int64, "Short": torch.int16,
    "ComplexDouble": torch.complex128, "ComplexFloat": torch.complex64,
}
# torch.cuda has storages for every prefix, tensor classes for the real ones only.
TENSOR_CLASSES = {f"{prefix}Tensor": dtype for prefix, dtype in DTYPES.items()
                  if not prefix.startswith("Complex")}
STORAGE_CLASSES = {f"{prefix}Storage": dtype for prefix, dtype in DTYPES.items()}

TENSOR_NAMES = {f"torch.cuda.{name}": dtype for name, dtype in TENSOR_CLASSES.items()}
TENSOR_NAME_BY_DTYPE = {dtype: name for name, dtype in TENSOR_NAMES.items()}


def cuda_tensor_name(tensor_type):
    """The CUDA legacy name a tensor type stands for (``"torch.cuda.HalfTensor"`` for that
    string or for the proxy's class), or None."""
    name = tensor_type if isinstance(tensor_type, str) else getattr(tensor_type, "_cudashim_legacy_name", None)
    return name if name in TENSOR_NAMES else None


HOST_TENSOR_NAMES = frozenset(f"torch.{name}" for name in TENSOR_CLASSES)


def names_a_host_type(tensor_type) -> bool:
    """Whether ``tensor_type`` is one of torch's legacy host tensor types (``torch.FloatTensor``,
    or its name): ``t.type(torch.FloatTensor)`` is a move to the host."""
    if isinstance(tensor_type, str):
        return tensor_type in HOST_TENSOR_NAMES
    return any(getattr(torch, name, None) is tensor_type for name in TENSOR_CLASSES)


def host_tensor_name(cuda_name: str) -> str:
    """The CPU type of the same element type: ``"torch.HalfTensor"``."""
    return cuda_name.replace("torch.cuda.", "torch.", 1)
