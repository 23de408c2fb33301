"""The compiled fast path's types, and the Python each is the twin of: the one table of twins.

``cudashim._speedups`` checks itself against it when it is imported (a build with other types
does not load, and the pure-Python wrappers run); torch.compile's tracing hook
(``patches/compiled.py``) reads it for the types whose instances carry their twin; the tests
run each pair on the same calls.
"""

from __future__ import annotations

from typing import Dict, Tuple

TWINS: Dict[str, Tuple[str, str]] = {          # type -> (its Python twin, what both do)
    "CallerCache": ("cudashim.callers:CallerPolicy", "does the calling code's module hear the truth"),
    "TruthSwitch": ("cudashim.patching.by_caller:answer_by_caller", "the real function or ours, by who asks"),
    "IsCuda": ("cudashim.patches.tensors:is_cuda_property", "Tensor.is_cuda, by who asks"),
    "Rewriter": ("cudashim.patching.rewriter:rewritten", "a callable's device arguments translated"),
    "DefaultDevice": ("cudashim.patches.tensors:install", "Tensor.cuda(), its device defaulting to 'cuda'"),
    "NamedDevice": ("cudashim.patches.device_objects:install",
                    "torch.device('cuda') through the class stand-in"),
    "DtypeGate": ("cudashim.kernels.gap_fill:filled", "a function with a filled kernel gap"),
    "HalfGate": ("cudashim.patches.precision:by_policy",
                 "a matmul under the float16 policy (and an op widened by measurement: by_measurement)"),
    "AtOnce": ("cudashim.patches.precision:_at_once",
               "a float16 call of inference computed in the policy's dtype in one frame"),
    "DeviceMemory": ("cudashim.device_memory:DeviceMemory",
                     "the storages a program put on the device, where that is host memory"),
    "Stay": ("cudashim.patches.residency:install",
             "a move to where a move placed the tensor already, where device memory is host memory"),
    "SideDevice": ("cudashim.patches.residency:_side_device",
                   "Tensor.device as the device object of the side the tensor is known to be on"),
    "LengthGate": ("cudashim.patches.reductions:install",
                   "a norm or dot cudashim blocks past a length, called shorter"),
}
