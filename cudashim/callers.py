"""The caller policy: who asks decides which answer they hear.

torch's internals must hear the truth (a CPU is not CUDA), or they take CUDA-only paths; the
user's program and its libraries hear the compatible answer.
"""

from __future__ import annotations

import sys

_BY_CODE: dict = {}          # code object -> whether it belongs to torch (a hot-path cache)
_BY_CODE_LIMIT = 8192


def asked_by_torch(depth: int = 2) -> bool:
    """Whether the function ``depth - 1`` frames up was called from torch's own code.

    torch's internals must hear the truth (a CPU is not CUDA), or they take CUDA-only
    paths; the user's program and its libraries hear the compatible answer. The answer is
    cached per calling code object: one dict lookup instead of reading the module name.
    """
    frame = sys._getframe(depth)
    code = frame.f_code
    known = _BY_CODE.get(code)
    if known is None:
        known = is_torch_module(frame.f_globals.get("__name__", ""))
        if len(_BY_CODE) < _BY_CODE_LIMIT:
            _BY_CODE[code] = known
    return known


def is_torch_module(name: str) -> bool:
    return name == "torch" or name.startswith("torch.")
