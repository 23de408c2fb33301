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

From Accelerate 1.16 every choice of device, distributed type and memory call starts from
``get_torch_accelerator_backend()``, which asks ``torch.accelerator.current_accelerator()``:
the program's view of it is the target device (on the CPU target, the CPU), so Accelerate took
no CUDA path at all (``DistributedType.NO`` under ``--multi_gpu``, and the Trainer's
``free_memory`` failed in ``torch.accelerator.memory.empty_cache``). Where it names the target
and ``torch.cuda`` shows a device, it answers CUDA and the ``torch.cuda`` the program sees, as on
a GPU machine; every module of Accelerate that holds the function by name gets the answer.
"""

from __future__ import annotations

import sys

import torch
import wrapt

STATE = "accelerate.state"
BACKEND = "accelerate.utils.imports"            # get_torch_accelerator_backend, from 1.16
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
    activation.when_imported(BACKEND, lambda module: _answer_cuda_for_the_target(activation, module))


def _answer_cuda_for_the_target(activation, imports):
    """``get_torch_accelerator_backend`` answering ``("cuda", torch.cuda)`` where it would answer
    the target, in ``imports`` and in every module of Accelerate imported before this that holds
    it by name (``from .utils import get_torch_accelerator_backend``; later imports take the
    answer from ``imports``)."""
    discover = getattr(imports, "get_torch_accelerator_backend", None)
    target_type = activation.backend.device_type
    if discover is None or target_type in OWN_LAYERS:
        return

    def cuda_where_the_target(discover, instance, args, kwargs):
        device_type, module = discover(*args, **kwargs)
        if device_type == target_type and torch.cuda.is_available():
            return "cuda", sys.modules["torch.cuda"]           # the program's torch.cuda
        return device_type, module

    wrapped = wrapt.FunctionWrapper(discover, cuda_where_the_target)
    for name, module in list(sys.modules.items()):
        if (name == "accelerate" or name.startswith("accelerate.")) and module is not None \
                and getattr(module, "get_torch_accelerator_backend", None) is discover:
            activation.registry.set_attr(module, "get_torch_accelerator_backend", wrapped)
