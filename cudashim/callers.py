"""The caller policy: who asks decides which answer they hear.

Some code must hear the truth about CUDA: torch's own modules (a CPU is not CUDA, or they take
CUDA-only paths), and libraries that load native CUDA code behind the same questions
(``torch.cuda.is_available()``, ``torch.version.cuda``, ``Tensor.is_cuda``). Told "CUDA is
here", bitsandbytes loads its CUDA library and dies on a build without CUDA; told the truth,
it runs its CPU backend. The program and every other library hear the compatible answer,
which is what lets unmodified CUDA code run.

``HONEST_BY_DEFAULT`` is the one table of who hears the truth; ``--honest-for`` adds modules
(``mylib``) or takes default ones out (``-bitsandbytes``). A module is matched with its
submodules (``deepspeed.ops`` covers ``deepspeed.ops.op_builder.builder``). Each question
asks ``hears_truth()`` about the frame that asked it, cached per code object.
"""

from __future__ import annotations

import sys
from typing import Dict, Iterable, Tuple

# module -> why it hears the truth
HONEST_BY_DEFAULT: Dict[str, str] = {
    "torch": "torch's internals choose CUDA-only code paths (inductor, CUDA IPC) on these answers",
    "bitsandbytes": "loads its CUDA library when told CUDA is there; its CPU backend runs otherwise",
    "flash_attn": "its kernels are CUDA C++",
    "xformers": "dispatches to CUDA C++ kernels when told CUDA is there",
    "triton": "compiles for the GPU it is told of",
    "apex": "its fused kernels are CUDA C++ extensions",
    "cupy": "runs on the CUDA runtime",
    "deepspeed.ops": "DeepSpeed's op builders compile CUDA C++ with nvcc",
    "vllm": "its kernels are CUDA C++ and triton",
    "transformer_engine": "its kernels are CUDA C++",
    "mamba_ssm": "its selective-scan kernels are CUDA C++",
    "causal_conv1d": "its kernels are CUDA C++",
    "auto_gptq": "its quantized kernels are CUDA C++",
    "awq": "its quantized kernels are CUDA C++",
    "exllamav2": "its kernels are CUDA C++",
}

_honest: Tuple[str, ...] = tuple(HONEST_BY_DEFAULT)
# The hot-path caches map id(code object) -> (the code object, the answer). Keyed by
# identity: code objects compare equal by content, so the same function in two modules (a
# library's and the program's) would share an answer. Holding the code keeps its id from
# being reused.
_BY_CODE_LIMIT = 8192


def honest_set(honest_for: Iterable[str] = ()) -> Tuple[str, ...]:
    """Who hears the truth under the setting: the defaults, plus each name in
    ``honest_for``, minus each ``-name``. torch always does (see the module doc)."""
    modules = dict.fromkeys(HONEST_BY_DEFAULT)
    for entry in sorted(honest_for):
        if entry.startswith("-"):
            modules.pop(entry[1:], None)
        else:
            modules[entry] = None
    modules["torch"] = None
    return tuple(modules)


def configure(honest_for: Iterable[str] = ()) -> None:
    """Put ``honest_set(honest_for)`` in force."""
    global _honest
    _honest = honest_set(honest_for)
    _BY_CODE.clear()
    if _compiled_cache is not None:
        _compiled_cache.clear()


def honest_modules() -> Tuple[str, ...]:
    return _honest


def _asking(module_decides):
    """A question about the code ``depth - 1`` frames up (the caller of the function
    asking), decided by its module's name: one dict lookup per call once its code object
    has been seen."""
    cache: dict = {}

    def ask(depth: int = 2) -> bool:
        frame = sys._getframe(depth)
        code = frame.f_code
        cached = cache.get(id(code))
        if cached is not None and cached[0] is code:
            return cached[1]
        known = module_decides(frame.f_globals.get("__name__", ""))
        if len(cache) < _BY_CODE_LIMIT:
            cache[id(code)] = (code, known)
        return known

    return ask, cache


def is_honest_module(name: str) -> bool:
    return any(name == module or name.startswith(module + ".") for module in _honest)


def is_torch_module(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


# Whether the caller hears the truth.
hears_truth, _BY_CODE = _asking(is_honest_module)
# Whether torch itself asks (not any honest library): for the questions only torch's
# internals ask while acting on the program's devices (``get_device_module("cuda")``).
asked_by_torch, _ = _asking(is_torch_module)


# The compiled twin of hears_truth's cache (speedups.py), made at first use.
_compiled_cache = None


def compiled_truth(compiled):
    """``compiled.CallerCache`` deciding as ``hears_truth``: the compiled wrappers ask it
    about their caller without a Python frame. ``configure()`` clears it with the rest."""
    global _compiled_cache
    if _compiled_cache is None:
        _compiled_cache = compiled.CallerCache(is_honest_module)
    return _compiled_cache


def asking_module(depth: int = 2) -> str:
    """The module of the code ``depth - 1`` frames up (for the report)."""
    return sys._getframe(depth).f_globals.get("__name__", "?")

