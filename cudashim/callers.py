"""The caller policy: who asks decides which answer they hear.

Some code must hear the truth about CUDA: torch's own modules (a CPU is not CUDA, or they take
CUDA-only paths), and libraries that load native CUDA code behind the same questions
(``torch.cuda.is_available()``, ``torch.version.cuda``, ``Tensor.is_cuda``). Told "CUDA is
here", bitsandbytes loads its CUDA library and dies on a build without CUDA; told the truth,
it runs its CPU backend. The program and every other library hear the compatible answer,
which is what lets unmodified CUDA code run.

``HONEST_BY_DEFAULT`` (from the library table, ``tables/libraries.py``) says who hears the truth; ``--honest-for`` adds modules
(``mylib``) or takes default ones out (``-bitsandbytes``). A module is matched with its
submodules (``deepspeed.ops`` covers ``deepspeed.ops.op_builder.builder``). Each question
asks ``hears_truth()`` about the frame that asked it, cached per code object.
"""

from __future__ import annotations

import sys
from typing import Dict, Iterable, Tuple

from .tables.libraries import LIBRARIES

# module -> why it hears the truth: torch, and the libraries the library table marks honest
HONEST_BY_DEFAULT: Dict[str, str] = {
    "torch": "torch's internals choose CUDA-only code paths (inductor, CUDA IPC) on these answers",
    **{name: library.honest for name, library in LIBRARIES.items() if library.honest is not None},
}

# torch's own modules that are CUDA programs themselves in some release: they call ``torch.cuda``
# for the devices the program's tensors are on, which are the target's. They hear what the
# program hears, whatever the honest set says.
TORCH_AS_A_PROGRAM: Dict[str, str] = {
    "torch.distributed._composable.fsdp": "FSDP2 before torch 2.6 takes CUDA's streams and events "
                                          "for the program's devices (torch.cuda.current_stream())",
}

# The hot-path caches map id(code object) -> (the code object, the answer). Keyed by
# identity: code objects compare equal by content, so the same function in two modules (a
# library's and the program's) would share an answer. Holding the code keeps its id from
# being reused. The compiled cache is given the same limit.
BY_CODE_LIMIT = 8192


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


def is_torch_module(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")


class CallerPolicy:
    """Who hears the truth, for one activation: ``activation.callers``.

    ``hears_truth(depth=2)`` asks about the code ``depth - 1`` frames up (the caller of the
    function asking); ``asked_by_torch`` is the same question with only torch's modules
    honest, for the questions only torch's internals ask while acting on the program's
    devices (``get_device_module("cuda")``).
    """

    def __init__(self, honest_for: Iterable[str] = ()):
        self.honest: Tuple[str, ...] = honest_set(honest_for)
        self.hears_truth = _asking(self.is_honest_module)
        self.asked_by_torch = _asking(is_torch_module)
        self._compiled = None

    def is_honest_module(self, name: str) -> bool:
        if _within(name, TORCH_AS_A_PROGRAM):
            return False
        return _within(name, self.honest)

    def compiled_cache(self, compiled):
        """``compiled.CallerCache`` deciding as ``hears_truth``: the compiled wrappers ask
        it about their caller without a Python frame."""
        if self._compiled is None:
            self._compiled = compiled.CallerCache(self.is_honest_module, BY_CODE_LIMIT)
        return self._compiled


def _within(name: str, modules: Iterable[str]) -> bool:
    """Whether module ``name`` is one of ``modules`` or below one."""
    return any(name == module or name.startswith(module + ".") for module in modules)


def _asking(module_decides):
    """A question about the code ``depth - 1`` frames up, decided by its module's name: one
    dict lookup per call once its code object has been seen."""
    cache: dict = {}

    def ask(depth: int = 2) -> bool:
        frame = sys._getframe(depth)
        code = frame.f_code
        cached = cache.get(id(code))
        if cached is not None and cached[0] is code:
            return cached[1]
        known = module_decides(frame.f_globals.get("__name__", ""))
        if len(cache) < BY_CODE_LIMIT:
            cache[id(code)] = (code, known)
        return known

    return ask


def asking_module(depth: int = 2) -> str:
    """The module of the code ``depth - 1`` frames up (for the report)."""
    return sys._getframe(depth).f_globals.get("__name__", "?")
