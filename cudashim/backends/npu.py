"""Huawei Ascend NPUs through ``torch_npu``; collectives over HCCL."""

from __future__ import annotations

import torch

from .base import Backend


class NPUBackend(Backend):
    name = "npu"
    detection_rank = 20
    device_type = "npu"
    deepspeed_accelerator = "npu"
    default_collective = "hccl"
    visible_devices_var = "ASCEND_RT_VISIBLE_DEVICES"
    vendor_package = "torch_npu"
    profiler_activity = "PrivateUse1"
    graph_class = "NPUGraph"
    install_hint = "pip install torch-npu, the release matching your torch and CANN toolkit"
    device_hint = "check the Ascend driver and that the CANN environment (set_env.sh) is loaded"

    def autocast_dtypes(self):
        return (torch.float16, torch.bfloat16)
