"""The legacy CUDA tensor and storage type names (``torch.cuda.FloatTensor``, ...).

One table, read by the proxy ``torch.cuda`` (which builds the classes) and by the tensor
patches (``t.type("torch.cuda.FloatTensor")``, ``t.type()`` answering a CUDA name).
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
