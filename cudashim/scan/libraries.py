"""Code no runtime shim can carry over, found by what it imports or names.

These are the scanner's own tables: the runtime has nothing to redirect here, because each
entry is native CUDA code (a library of CUDA kernels, a CUDA library loaded by hand, NVIDIA's
tools) rather than a torch API. Where the runtime does redirect, the scanner reads the
runtime's tables instead (``target.py``).
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

_SDPA = "torch.nn.functional.scaled_dot_product_attention"
_FUSED_OPTIMIZERS = "torch.optim.AdamW(fused=True) or foreach optimizers"

# import name (matched with its submodules) -> (what it is, the way out)
CUDA_ONLY_LIBRARIES: Dict[str, Tuple[str, str]] = {
    "flash_attn": ("FlashAttention's CUDA kernels",
                   f"call {_SDPA}, or load transformers models with attn_implementation='sdpa'"),
    "xformers": ("xformers' CUDA attention kernels", f"call {_SDPA} with the bias as attn_mask"),
    "apex": ("NVIDIA apex's fused CUDA extensions",
             f"use {_FUSED_OPTIMIZERS}, torch.nn.LayerNorm/RMSNorm and torch.amp"),
    "amp_C": ("apex's multi-tensor CUDA kernels", "use torch._foreach_* operations"),
    "fused_layer_norm_cuda": ("apex's fused layer norm kernels", "use torch.nn.LayerNorm"),
    "transformer_engine": ("Transformer Engine's CUDA kernels", "use the torch.nn modules it wraps"),
    "mamba_ssm": ("Mamba's selective-scan CUDA kernels", "use a reference (torch) implementation"),
    "causal_conv1d": ("causal-conv1d's CUDA kernels", "use torch.nn.functional.conv1d with padding"),
    "auto_gptq": ("AutoGPTQ's CUDA kernels", "load an unquantized or a target-supported checkpoint"),
    "awq": ("AutoAWQ's CUDA kernels", "load an unquantized or a target-supported checkpoint"),
    "exllamav2": ("ExLlamaV2's CUDA kernels", "use a torch inference path"),
    "cupy": ("CuPy, which runs on the CUDA runtime", "write the array code with torch or numpy"),
    "numba.cuda": ("numba's CUDA kernels", "write the kernel with torch operations or numba on the CPU"),
    "pycuda": ("PyCUDA, which drives the CUDA driver", "write the kernel with torch operations"),
    "cuda": ("NVIDIA's cuda-python bindings", "use the torch.cuda API, which cudashim redirects"),
    "tensorrt": ("TensorRT, NVIDIA's inference runtime", "run the torch model, or torch.compile it"),
    "torch_tensorrt": ("Torch-TensorRT, NVIDIA's inference compiler", "use torch.compile"),
    "pynvml": ("NVML, NVIDIA's management library",
               "ask torch.cuda (device_count, get_device_name, mem_get_info, memory_allocated), "
               "which cudashim answers for the target"),
    "nvidia_smi": ("NVML, NVIDIA's management library", "ask torch.cuda's memory functions"),
    "GPUtil": ("GPUtil, which reads nvidia-smi", "ask torch.cuda's memory functions"),
}

# Kernel decorators: the qualified prefix -> the kernel language
KERNEL_DECORATORS: Dict[str, str] = {"triton.": "triton", "numba.cuda.": "cuda"}

KERNEL_WAY_OUT = ("write the op with torch operations (torch.compile generates kernels for the "
                  "target), or keep a torch fallback next to the kernel")

_CUDA_LIBRARY_FILE = re.compile(
    r"^(?:.*/)?(?:lib)?(cudart|cuda|cublas|cublasLt|cudnn|nccl|nvrtc|nvidia-ml|nvToolsExt|cufft|"
    r"curand|cusparse|cusolver)(?:64_\d+)?(?:\.so[.\d]*|\.dll|\.dylib)?$")


def cuda_only_library(module: str) -> Optional[Tuple[str, str, str]]:
    """(the table's name, what, way out) when ``module`` is, or is inside, a CUDA-only library."""
    for name, (what, way_out) in CUDA_ONLY_LIBRARIES.items():
        if module == name or module.startswith(name + "."):
            return name, what, way_out
    return None


def cuda_library_file(text: str, bare_names: bool) -> Optional[str]:
    """The CUDA library a path or library name names (``libcudart.so.12``); bare names
    (``"cudart"``) count only where ``bare_names`` (an argument of ctypes' loaders)."""
    match = _CUDA_LIBRARY_FILE.match(text)
    if match is None or (not bare_names and not re.search(r"\.(so|dll|dylib)", text)):
        return None
    return match.group(1)


def cuda_tool(text: str) -> Optional[str]:
    """'nvidia-smi' or 'nvcc' when a command line starts with one of NVIDIA's tools."""
    first = text.split(maxsplit=1)[0] if text.strip() else ""
    name = first.rsplit("/", 1)[-1]
    return name if name in ("nvidia-smi", "nvcc") else None


def cuda_toolkit_path(text: str) -> bool:
    return text.startswith("/usr/local/cuda") or text in ("CUDA_HOME", "CUDA_PATH")
