"""CUDA pass-through: on a machine with working CUDA, cudashim changes nothing."""

from __future__ import annotations

import torch

from .base import Backend


class CUDABackend(Backend):
    name = "cuda"
    detection_rank = 0
    device_type = "cuda"
    kernel_languages = ("cuda", "triton")
    optional_packages = ("cupy",)                 # cudashim.kernels' fast paths on CUDA
    default_collective = "nccl"
    visible_devices_var = None
    redirects = False

    @classmethod
    def absent_reason(cls):
        if not torch.cuda.is_available():
            return ("no working CUDA device: torch.cuda.is_available() is False "
                    f"(torch {torch.__version__}, built with CUDA {torch.version.cuda})")
        return None

    def device_module(self):
        return torch.cuda

    def process_group_backend(self) -> str:
        return "nccl"
