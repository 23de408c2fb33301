"""Hugging Face Accelerate's CUDA path works on the target: its state holds a CUDA device.

Accelerate chooses its device in ``PartialState.set_device``: on a machine where
``torch.cuda.is_available()`` (under cudashim, the program's view) it builds
``torch.device("cuda", local_rank)``, which cudashim makes the target's. Accelerate then
reads ``device.type``: with "cpu" it turns ``mixed_precision="fp16"`` off without a word;
with a PrivateUse1 type it refuses fp16 ("fp16 mixed precision requires a device in ...").

So the state keeps the CUDA device Accelerate chose, as on a GPU machine: its GradScaler,
autocast, DDP ``device_ids`` and every ``.to(state.device)`` go through the surface cudashim
translates. Targets Accelerate has a layer of its own for, which it checks before CUDA (MPS,
NPU, HPU, MLU, MUSA, SDAA), keep Accelerate's choice.
"""

from __future__ import annotations

import torch
import wrapt

STATE = "accelerate.state"
# Device types Accelerate chooses before asking torch.cuda (PartialState.default_device).
OWN_LAYERS = frozenset({"mps", "mlu", "sdaa", "musa", "npu", "hpu"})


def install(activation):
    real_device = torch._C.device           # torch.device before cudashim's proxy: not translated
    target_type = activation.backend.device_type

    def keep_cuda_device(set_device, state, args, kwargs):
        chosen_before = state.__dict__.get("device") is not None
        set_device(*args, **kwargs)
        device = state.__dict__.get("device")
        if chosen_before or device is None or device.type != target_type or target_type in OWN_LAYERS \
                or state.__dict__.get("_cpu") or not torch.cuda.is_available():
            return
        kind = str(state.distributed_type).rpartition(".")[2]
        if kind == "MULTI_GPU":
            state.device = real_device("cuda", state.local_process_index % torch.cuda.device_count())
        elif kind == "NO":
            state.device = real_device("cuda")

    activation.when_imported(STATE, lambda module: activation.replace(
        module.PartialState, "set_device", lambda original: wrapt.FunctionWrapper(original, keep_cuda_device)))
