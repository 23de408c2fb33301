"""Code no runtime shim can carry over, found by what it imports or names.

The libraries come from the one library table (``cudashim/tables/libraries.py``), which the
caller policy and the stand-ins read too; the rest are the scanner's own rules for native CUDA
code (kernel decorators, CUDA libraries loaded by hand, NVIDIA's tools). Where the runtime
redirects, the scanner reads the runtime's tables (``target.py``).
"""

from __future__ import annotations

import re
from typing import Dict, Optional, Tuple

from ..tables.libraries import LIBRARIES, library_of

# import name (matched with its submodules) -> (what it is, the way out)
CUDA_ONLY_LIBRARIES: Dict[str, Tuple[str, str]] = {
    name: (library.what, library.way_out) for name, library in LIBRARIES.items() if library.way_out}

# Kernel decorators: the qualified prefix -> the kernel language
KERNEL_DECORATORS: Dict[str, str] = {"triton.": "triton", "numba.cuda.": "cuda"}

KERNEL_WAY_OUT = ("write the op with torch operations (torch.compile generates kernels for the "
                  "target), or keep a torch fallback next to the kernel")

_CUDA_LIBRARY_FILE = re.compile(
    r"^(?:.*/)?(?:lib)?(cudart|cuda|cublas|cublasLt|cudnn|nccl|nvrtc|nvidia-ml|nvToolsExt|cufft|"
    r"curand|cusparse|cusolver)(?:64_\d+)?(?:\.so[.\d]*|\.dll|\.dylib)?$")


def cuda_only_library(module: str) -> Optional[Tuple[str, str, str]]:
    """(the table's name, what, way out) when ``module`` is, or is inside, a CUDA-only library."""
    library = library_of(module)
    if library is None or library.way_out is None:
        return None
    return library.name, library.what, library.way_out


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
