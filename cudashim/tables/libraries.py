"""The CUDA libraries programs import, and what cudashim does with each: the one table.

Each entry says, for one import name (matched with its submodules):

- ``what`` it is and, where nothing at run time can carry it over, the ``way_out`` that
  ``cudashim scan`` and the refusals name;
- ``honest``: why it hears the truth about CUDA (the caller policy, ``callers.py``), where it
  loads native CUDA code behind ``torch.cuda.is_available()`` and the like;
- ``stand_in``: the stand-in served under its name where the real package cannot work on the
  target (``cudashim/substitutes/<name>``), with the first call that tries the real one.

A new stand-in is its folder under ``cudashim/substitutes`` and its entry here. This module
imports no torch: the probes import it when they run.
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, NamedTuple, Optional, Tuple

# The version suffix every stand-in's metadata carries: a PEP 440 local label, so version
# checks (">= 2.3.3") pass and the installed "package" still says what it is.
LOCAL_VERSION = "cudashim"


class StandIn(NamedTuple):
    name: str                        # the --substitute name (the library's import name)
    modules: Tuple[str, ...]         # top-level import names it serves
    distribution: str                # the distribution name its metadata answers to
    version: str                     # the upstream API version the stand-in follows
    substituted: str                 # what the stand-in covers (named in its refusals)
    # The first call a program makes, tried on the real package: (module, device) -> None,
    # raising where the real one cannot work on the target.
    probe: Optional[Callable] = None
    # Whether the real package imports torch itself: then its import, before torch's, completes
    # an activation waiting for torch (``activation._StandInsWaiting``), at no cost of its own.
    imports_torch: bool = True

    @property
    def full_version(self) -> str:
        return f"{self.version}+{LOCAL_VERSION}"


class Library(NamedTuple):
    name: str                        # the import name
    what: str                        # what it is, as findings and refusals name it
    way_out: Optional[str] = None    # None: importing it is not a finding of its own
    honest: Optional[str] = None     # why it hears the truth about CUDA, or None
    stand_in: Optional[StandIn] = None


def _flash_attn(module, device) -> None:
    import torch

    q = torch.zeros(1, 1, 1, 8, dtype=torch.float16, device=device)
    module.flash_attn_func(q, q, q)


def _xformers(module, device) -> None:
    import torch

    ops = importlib.import_module("xformers.ops")
    q = torch.zeros(1, 1, 1, 8, device=device)
    ops.memory_efficient_attention(q, q, q)


def _apex(module, device) -> None:
    import torch

    importlib.import_module("amp_C")
    optimizers = importlib.import_module("apex.optimizers")
    weight = torch.zeros(2, device=device, requires_grad=True)
    weight.grad = torch.ones(2, device=device)
    optimizers.FusedAdam([weight]).step()


def _pynvml(module, device) -> None:
    module.nvmlInit()
    module.nvmlShutdown()


_SDPA = "torch.nn.functional.scaled_dot_product_attention"
_FUSED_OPTIMIZERS = "torch.optim.AdamW(fused=True) or foreach optimizers"
_CUDA_CPP = "its kernels are CUDA C++"
_QUANTIZED_CUDA_CPP = "its quantized kernels are CUDA C++"
_UNQUANTIZED = "load an unquantized or a target-supported checkpoint"
_NVML_WAY_OUT = "ask torch.cuda's memory functions"

LIBRARIES: Dict[str, Library] = {library.name: library for library in (
    Library("flash_attn", "FlashAttention's CUDA kernels",
            f"call {_SDPA}, or load transformers models with attn_implementation='sdpa'",
            honest=_CUDA_CPP,
            stand_in=StandIn(
                "flash_attn", ("flash_attn",), "flash_attn", "2.8.3",
                "flash_attn_func, its qkv/kv-packed and varlen variants, flash_attn_with_kvcache "
                "(causal, softmax_scale, dropout_p, window_size, softcap, alibi_slopes, "
                "return_attn_probs, paged KV), flash_attn.bert_padding, flash_attn.layers.rotary, "
                "on scaled_dot_product_attention", _flash_attn)),
    Library("xformers", "xformers' CUDA attention kernels", f"call {_SDPA} with the bias as attn_mask",
            honest="dispatches to CUDA C++ kernels when told CUDA is there",
            stand_in=StandIn(
                "xformers", ("xformers",), "xformers", "0.0.32",
                "xformers.ops.memory_efficient_attention with LowerTriangularMask, BlockDiagonalMask "
                "(and its causal, local and bottom-right variants), tensor biases, fmha op names, "
                "on scaled_dot_product_attention", _xformers)),
    Library("apex", "NVIDIA apex's fused CUDA extensions",
            f"use {_FUSED_OPTIMIZERS}, torch.nn.LayerNorm/RMSNorm and torch.amp",
            honest="its fused kernels are CUDA C++ extensions",
            stand_in=StandIn(
                "apex", ("apex", "amp_C"), "apex", "0.1",
                "apex.optimizers (FusedAdam, FusedSGD, FusedAdagrad on torch.optim; FusedLAMB, "
                "FusedNovoGrad written here), apex.normalization, apex.amp on torch.amp, "
                "apex.parallel.DistributedDataParallel on torch's DDP, amp_C's l2norm/scale/axpby "
                "through apex.multi_tensor_apply", _apex)),
    Library("amp_C", "apex's multi-tensor CUDA kernels", "use torch._foreach_* operations"),
    Library("fused_layer_norm_cuda", "apex's fused layer norm kernels", "use torch.nn.LayerNorm"),
    Library("pynvml", "NVML, NVIDIA's management library",
            "ask torch.cuda (device_count, get_device_name, mem_get_info, memory_allocated), "
            "which cudashim answers for the target",
            stand_in=StandIn(
                "pynvml", ("pynvml",), "nvidia-ml-py", "12.575.51",
                "nvmlInit/Shutdown, device count, handles, name, UUID, memory, utilization, "
                "temperature, power, driver and CUDA versions, running processes, answered by "
                "the target", _pynvml, imports_torch=False)),
    Library("bitsandbytes", "bitsandbytes' quantization kernels",
            honest="loads its CUDA library when told CUDA is there; its CPU backend runs otherwise"),
    Library("triton", "the triton compiler", honest="compiles for the GPU it is told of"),
    Library("deepspeed.ops", "DeepSpeed's op builders",
            honest="DeepSpeed's op builders compile CUDA C++ with nvcc"),
    Library("vllm", "vLLM's engine", honest="its kernels are CUDA C++ and triton"),
    Library("transformer_engine", "Transformer Engine's CUDA kernels",
            "use the torch.nn modules it wraps", honest=_CUDA_CPP),
    Library("mamba_ssm", "Mamba's selective-scan CUDA kernels", "use a reference (torch) implementation",
            honest="its selective-scan kernels are CUDA C++"),
    Library("causal_conv1d", "causal-conv1d's CUDA kernels",
            "use torch.nn.functional.conv1d with padding", honest=_CUDA_CPP),
    Library("auto_gptq", "AutoGPTQ's CUDA kernels", _UNQUANTIZED, honest=_QUANTIZED_CUDA_CPP),
    Library("awq", "AutoAWQ's CUDA kernels", _UNQUANTIZED, honest=_QUANTIZED_CUDA_CPP),
    Library("exllamav2", "ExLlamaV2's CUDA kernels", "use a torch inference path", honest=_CUDA_CPP),
    Library("cupy", "CuPy, which runs on the CUDA runtime", "write the array code with torch or numpy",
            honest="runs on the CUDA runtime"),
    Library("numba.cuda", "numba's CUDA kernels",
            "write the kernel with torch operations or numba on the CPU"),
    Library("pycuda", "PyCUDA, which drives the CUDA driver", "write the kernel with torch operations"),
    Library("cuda", "NVIDIA's cuda-python bindings", "use the torch.cuda API, which cudashim redirects"),
    Library("tensorrt", "TensorRT, NVIDIA's inference runtime", "run the torch model, or torch.compile it"),
    Library("torch_tensorrt", "Torch-TensorRT, NVIDIA's inference compiler", "use torch.compile"),
    Library("nvidia_smi", "NVML, NVIDIA's management library", _NVML_WAY_OUT),
    Library("GPUtil", "GPUtil, which reads nvidia-smi", _NVML_WAY_OUT),
)}

STAND_INS: Dict[str, StandIn] = {library.name: library.stand_in
                                 for library in LIBRARIES.values() if library.stand_in is not None}


def library_of(module: str) -> Optional[Library]:
    """The entry ``module`` is, or is inside, with the longest name (``numba.cuda.jit`` is
    numba's CUDA kernels; ``numba`` alone is no entry)."""
    found = None
    for name, library in LIBRARIES.items():
        inside = module == name or module.startswith(name + ".")
        if inside and (found is None or len(name) > len(found.name)):
            found = library
    return found
