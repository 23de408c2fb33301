"""Whether a real CUDA-only package that imported also works on the target.

Many import and fail later: apex installs without its CUDA extensions, pip's xformers imports
on a CPU build and finds no operator at the first call, pynvml is pure Python and fails at
``nvmlInit`` without NVIDIA's driver. So the real package gets one tiny call on the target,
the one a program makes first; an exception means it cannot work here, and the stand-in is
served instead. Each probe returns None when the package works, else why not.
"""

from __future__ import annotations

import importlib
from typing import Callable, Dict, Optional


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


PROBES: Dict[str, Callable] = {"flash_attn": _flash_attn, "xformers": _xformers,
                               "apex": _apex, "pynvml": _pynvml}


def why_not_working(library: str, module, device) -> Optional[str]:
    """None if ``library`` (imported as ``module``) works on ``device``, else the reason."""
    probe = PROBES.get(library)
    if probe is None:
        return None
    try:
        probe(module, device)
    except Exception as exc:                  # any failure of the real package is the answer
        first_line = (str(exc).strip().splitlines() or [""])[0][:160]
        return f"it fails on {device.type}: {type(exc).__name__}: {first_line}"
    return None
