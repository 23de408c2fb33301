"""``shimccl``: the test accelerator's collective library.

Registered with ``torch.distributed`` for the ``shimdev`` device type, as HCCL is for ``npu``
and oneCCL for ``xpu``, so cudashim maps NCCL to it by the same rule as to theirs. Its
collectives move device tensors through host memory to gloo (cudashim's staging, under this
library's own name).
"""

from __future__ import annotations

NAME = "shimccl"


def register() -> None:
    import torch.distributed as dist
    if not dist.is_available() or NAME in dist.Backend.backend_list:
        return
    from ..backends import staged
    from . import NAME as DEVICE
    dist.Backend.register_backend(NAME, staged.creator(NAME), devices=["cpu", DEVICE])
