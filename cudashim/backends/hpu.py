"""Intel Gaudi (HPU) through ``habana_frameworks.torch``; collectives over HCCL.

Habana registers its ``hccl`` process-group backend when its distributed module is
imported, so that import happens when NCCL is first asked for, not at start-up.
"""

from __future__ import annotations

import importlib

import torch

from .base import Backend

HCCL_MODULE = "habana_frameworks.torch.distributed.hccl"


class HPUBackend(Backend):
    name = "hpu"
    detection_rank = 30
    device_type = "hpu"
    deepspeed_accelerator = "hpu"
    default_collective = "hccl"
    visible_devices_var = "HABANA_VISIBLE_MODULES"
    vendor_package = "habana_frameworks.torch"
    profiler_activity = "HPU"
    graph_class = "HPUGraph"
    install_hint = "install the Intel Gaudi software stack: https://docs.habana.ai/en/latest/Installation_Guide/"
    device_hint = "check the Gaudi driver (hl-smi) and HABANA_VISIBLE_MODULES"

    def choose_collective(self) -> str:
        importlib.import_module(HCCL_MODULE)
        return self.default_collective

    def autocast_dtypes(self):
        return (torch.bfloat16, torch.float16)
