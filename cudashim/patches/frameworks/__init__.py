"""Frameworks with an accelerator layer of their own run on the target, the program keeping
its CUDA words: DeepSpeed on its own accelerator for the target, Lightning and Accelerate on
their CUDA paths.

Lightning's part is ``lightning.py``, Accelerate's ``accelerate.py``, Ray's GPU count
``ray.py``, the Hub's kernels that transformers loads models with ``hub_kernels.py``. The rest of
this module is DeepSpeed's.

DeepSpeed chooses its device layer (``deepspeed.accelerator``) from ``DS_ACCELERATOR``, or,
where that is unset, from what ``torch.cuda`` answers, which under cudashim is the program's
view: it would choose its CUDA accelerator and ask nvcc for its ops. So this group names the
target's accelerator in ``DS_ACCELERATOR`` (unless the user named one), for this process
and every rank it launches. DeepSpeed then runs its own CPU, XPU, NPU, HPU or MPS
accelerator: its op builders, collective library and profiler ranges for the target.

DeepSpeed's CPU accelerator refuses fp16 configs ("Type fp16 is not supported on your
device") unless oneDNN computes float16 natively. Under cudashim float16 tensors compute as
the precision policy says (the matmul family in float32, rounded once), so that accelerator
answers that fp16 is supported.

The 1-bit optimizers' ``"nccl"`` backend packs with CuPy, and DeepSpeed's CPU, MPS and HPU
accelerators have no packbits op for its ``"compressed"`` backend: ``deepspeed_onebit.py``
serves both from ``cudashim.kernels``.

DeepSpeed's CPU communication (``deepspeed_shm_comm``) gives every rank a 66 MiB buffer in
``/dev/shm`` named after the master's address and port, and never unlinks it: each run would
leave its buffers in host memory until the machine restarts. Once every rank has opened its
peers' buffers (which DeepSpeed's backend does before it returns), a name serves nobody, so
each rank unlinks its own at exit.

DeepSpeed's multi-node runner (pdsh, MPI, Slurm) passes a remote node only the variables whose
names start with its prefixes, and its accelerator's: CUDA's adds ``NCCL``, the target's may
add none. The runner under cudashim passes on what the runner on CUDA would, and cudashim's
own switch and settings, so every node's ranks come up shimmed and read the job's NCCL setup.
"""

from __future__ import annotations

import atexit
import os
import sys
import warnings
from pathlib import Path
from typing import Optional, Tuple

import wrapt

from ...errors import CudashimWarning, UnsupportedCudaAPI
from . import accelerate, hub_kernels, lightning, ray
from . import deepspeed_onebit as onebit

SELECTOR = "DS_ACCELERATOR"
ACCELERATORS = "deepspeed.accelerator.real_accelerator"
CPU_ACCELERATOR, _ = onebit.accelerator_class("cpu")
TORCH_BACKEND = "deepspeed.comm.torch"
OP_BUILDERS = "deepspeed.ops.op_builder.builder"
MULTINODE_RUNNER = "deepspeed.launcher.runner"
EXPORTED_PREFIXES = ("NCCL", "CUDASHIM")        # CUDA's accelerator's, and cudashim's
SHARED_MEMORY = Path("/dev/shm")


# The calls through which a program hands a framework its device choice, by qualified name
# (``scan`` reports what each gets on a target).
ENTRY_POINTS = {
    **{f"{package}.Trainer": "Lightning" for package in ("lightning", "lightning.pytorch", "pytorch_lightning")},
    **{f"{package}.Fabric": "Lightning" for package in ("lightning", "lightning.fabric", "lightning_fabric")},
    "accelerate.Accelerator": "Accelerate",
    "accelerate.notebook_launcher": "Accelerate",
    "deepspeed.initialize": "DeepSpeed",
    **{f"{package}.ScalingConfig": "Ray" for package in ("ray.train", "ray.train.torch", "ray.air")},
}
# The keyword through which an entry point is told its device, and what a GPU program passes.
DEVICE_KEYWORDS = {"Lightning": "accelerator", "Ray": "use_gpu"}
GPU_CHOICES = {"Ray": True}
# Lightning's accelerator names that reach its CUDA accelerator on a GPU machine.
LIGHTNING_CUDA_NAMES = frozenset({"gpu", "cuda", "auto"})


def what_it_gets(framework: str, accelerator, device_type: str,
                 deepspeed_accelerator: Optional[str]) -> Optional[Tuple[bool, str]]:
    """(runs, what happens) for a program's call into ``framework`` on a target whose device
    is ``device_type``; ``accelerator`` is the value of its ``DEVICE_KEYWORDS`` keyword as
    written (None where not). None where the call does not choose CUDA (``accelerator="cpu"``,
    Ray without ``use_gpu=True``)."""
    if framework == "Ray":
        if accelerator is not True:                         # Ray's default is the CPU
            return None
        return True, (f"Ray counts the CUDA devices the program sees, so use_gpu=True schedules its "
                      f"workers on them; the workers it starts are under cudashim, on the "
                      f"{device_type} device")
    if framework == "Lightning":
        if accelerator is not None and accelerator not in LIGHTNING_CUDA_NAMES:
            return None
        return True, (f"Lightning's CUDA accelerator (accelerator={accelerator or 'auto'!r}): it holds "
                      f"CUDA devices, and what it moves to them is placed on the {device_type} device")
    if framework == "Accelerate":
        if device_type in accelerate.OWN_LAYERS:
            return True, f"Accelerate's own {device_type} path, which it checks before CUDA"
        return True, (f"Accelerate's CUDA path: the device it chooses stays a CUDA device, placed on the "
                      f"{device_type} device, and fp16 is CUDA's AMP as the precision policy runs it")
    if deepspeed_accelerator is None:
        return False, (f"DeepSpeed has no accelerator for the {device_type} device: it runs its CUDA "
                       f"accelerator, whose ops (built with nvcc) are refused; the config's PyTorch "
                       f"implementations (\"torch_adam\": true) run")
    return True, (f"DeepSpeed's own {deepspeed_accelerator!r} accelerator ({SELECTOR}), with its ops and "
                  f"collectives for the target")


def install(activation):
    lightning.install(activation)
    accelerate.install(activation)
    ray.install(activation)
    hub_kernels.install(activation)
    wanted = activation.backend.deepspeed_accelerator
    if wanted is None:                       # a target DeepSpeed has no layer for
        _refuse_cuda_ops(activation)
        return
    if SELECTOR not in os.environ:
        activation.registry.set_item(os.environ, SELECTOR, wanted)

    def check_choice(module):
        """DeepSpeed imported and asked before activation keeps the accelerator it chose."""
        chosen = getattr(module, "ds_accelerator", None)
        if chosen is not None and getattr(chosen, "_name", wanted) != wanted:
            warnings.warn(
                f"DeepSpeed chose its {chosen._name!r} accelerator before cudashim was active; "
                f"on the {activation.backend.name!r} backend it needs {wanted!r}. Start the "
                f"program with `python -m cudashim`, or set {SELECTOR}={wanted}.",
                CudashimWarning, stacklevel=2)

    def answer_fp16(module):
        activation.registry.set_attr(module.CPU_Accelerator, "is_fp16_supported", _fp16_supported)

    def fill_in_packbits(module):
        accelerator = getattr(module, accelerator_class, None)
        if hasattr(accelerator, "get_op_builder"):
            activation.replace(accelerator, "get_op_builder",
                               lambda original: wrapt.FunctionWrapper(original, onebit.fill_in_packbits))

    def export_to_every_node(module):
        exported = list(module.EXPORT_ENVS)
        activation.registry.set_attr(module, "EXPORT_ENVS",
                                     exported + [p for p in EXPORTED_PREFIXES if p not in exported])

    activation.when_imported(ACCELERATORS, check_choice)
    activation.when_imported(CPU_ACCELERATOR, answer_fp16)
    activation.when_imported(MULTINODE_RUNNER, export_to_every_node)
    accelerator_module, accelerator_class = onebit.accelerator_class(wanted)
    activation.when_imported(accelerator_module, fill_in_packbits)
    _serve_the_nccl_backend(activation)
    if wanted == "cpu":
        activation.when_imported(TORCH_BACKEND, lambda module: activation.replace(
            module.TorchBackend, "__init__",
            lambda original: wrapt.FunctionWrapper(original, _unlink_buffer_at_exit)))


def _refuse_cuda_ops(activation) -> None:
    """Where DeepSpeed has no accelerator for the target it runs its CUDA one, whose op
    builders ask nvcc for a CUDA device and fail deep inside (an IndexError on the empty list
    of compute capabilities): the program hears which op and what to do instead."""
    backend = activation.backend

    def refuse(load, builder, args, kwargs):
        raise UnsupportedCudaAPI(
            f"DeepSpeed's CUDA op {getattr(builder, 'name', type(builder).__name__)!r}", backend.name,
            f"DeepSpeed has no accelerator for the {backend.device_type!r} device, so it runs its "
            "CUDA accelerator, whose ops build with nvcc for a CUDA device; choose the config's "
            "PyTorch implementation where it has one (\"torch_adam\": true in the optimizer's "
            "params), or run on a target DeepSpeed has an accelerator for (cpu, xpu, npu, hpu, mps)")

    activation.when_imported(OP_BUILDERS, lambda module: activation.replace(
        module.CUDAOpBuilder, "load", lambda original: wrapt.FunctionWrapper(original, refuse)))


def _unlink_buffer_at_exit(init, backend, args, kwargs):
    """After DeepSpeed's backend is up, the rank's shared-memory buffer is unlinked at exit."""
    init(*args, **kwargs)
    if getattr(backend, "shm_comm_op", None) is None:
        return
    buffer = SHARED_MEMORY / shared_buffer_name(backend.get_rank())
    if buffer.exists():
        atexit.register(buffer.unlink, missing_ok=True)


def shared_buffer_name(rank: int) -> str:
    """The name deepspeed_shm_comm gives a rank's allreduce buffer (shm.cpp's SHM_BUFFER_NAME)."""
    return "_".join(("deepspeed_allreduce_buffer", str(os.getuid()), os.environ.get("MASTER_ADDR", ""),
                     os.environ.get("MASTER_PORT", ""), str(rank)))


def _serve_the_nccl_backend(activation):
    """The 1-bit optimizers' NCCL backend, which packs with CuPy (CUDA only), on
    cudashim.kernels: served at its import, or swapped in where it was imported already."""
    imported = sys.modules.get(onebit.NCCL_MODULE)
    if imported is not None:
        activation.registry.set_attr(imported, "NcclBackend", onebit.NcclBackend)
        return
    onebit.NcclBackendFinder(activation).install()


def _fp16_supported(accelerator) -> bool:
    """torch computes float16 on the host; the precision policy widens its matmuls."""
    return True
