"""Intel GPUs (XPU) through torch's in-tree ``torch.xpu``.

``intel_extension_for_pytorch`` is imported only when it is installed and torch alone
finds no XPU (older torch builds get their XPU support from it). Collectives: torch's own
``xccl`` where this torch has it, else oneCCL's ``ccl`` from ``oneccl_bindings_for_pytorch``.
"""

from __future__ import annotations

import importlib
from typing import Optional

import torch

from .base import Backend, module_found, no_collective

IPEX = "intel_extension_for_pytorch"
ONECCL = "oneccl_bindings_for_pytorch"


class XPUBackend(Backend):
    name = "xpu"
    detection_rank = 10
    device_type = "xpu"
    optional_packages = (IPEX, ONECCL)
    deepspeed_accelerator = "xpu"
    kernel_languages = ("triton",)
    default_collective = "xccl"
    visible_devices_var = "ZE_AFFINITY_MASK"
    profiler_activity = "XPU"
    graph_class = "XPUGraph"
    device_hint = ("install a torch built for Intel GPUs: pip install torch --index-url "
                   "https://download.pytorch.org/whl/xpu, and Intel's GPU driver")

    @classmethod
    def absent_reason(cls) -> Optional[str]:
        if _xpu_available():
            return None
        if module_found(IPEX):
            try:
                importlib.import_module(IPEX)
            except Exception as exc:
                return f"'{IPEX}' failed to import ({type(exc).__name__}: {exc})"
            if _xpu_available():
                return None
        return cls.device_absent_reason()

    def choose_collective(self) -> str:
        import torch.distributed as dist
        if getattr(dist, "is_xccl_available", lambda: False)():
            return "xccl"
        if module_found(ONECCL):
            importlib.import_module(ONECCL)   # registers the "ccl" process-group backend
            return "ccl"
        raise no_collective(self.name, f"this torch has no xccl and '{ONECCL}' is not installed "
                                       f"(pip install oneccl_bind_pt)")


def _xpu_available() -> bool:
    xpu = getattr(torch, "xpu", None)
    return xpu is not None and xpu.is_available()
