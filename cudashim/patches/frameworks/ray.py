"""Ray counts the CUDA devices the program sees, so ``use_gpu=True`` gets workers.

Ray schedules GPU work (``ScalingConfig(use_gpu=True)`` in Ray Train, ``@ray.remote(num_gpus=1)``)
on the GPUs its head node counted when it started: NVIDIA's, counted through the copy of
pynvml Ray carries inside itself, which no stand-in reaches. Off NVIDIA that count is zero, and
a GPU job waits for resources that never come. Under cudashim the node counts what
``torch.cuda.device_count()`` answers the program. Each worker Ray starts gets its devices in
``CUDA_VISIBLE_DEVICES``, which cudashim maps to the target's devices in that worker; there,
Ray Train's ``get_device()`` builds CUDA devices, which cudashim translates, and its "nccl"
process group becomes the target's collective library.
"""

from __future__ import annotations

import torch

NVIDIA_MANAGER = "ray._private.accelerators.nvidia_gpu"


def install(activation) -> None:
    def count_what_the_program_sees(module):
        manager = getattr(module, "NvidiaGPUAcceleratorManager", None)
        if manager is not None:
            activation.registry.set_attr(manager, "get_current_node_num_accelerators",
                                         staticmethod(_cuda_device_count))

    activation.when_imported(NVIDIA_MANAGER, count_what_the_program_sees)


def _cuda_device_count() -> int:
    return torch.cuda.device_count()
