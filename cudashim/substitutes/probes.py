"""Whether a real CUDA-only package that imported also works on the target.

Many import and fail later: apex installs without its CUDA extensions, pip's xformers imports
on a CPU build and finds no operator at the first call, pynvml is pure Python and fails at
``nvmlInit`` without NVIDIA's driver. So the real package gets one tiny call on the target,
the one a program makes first (each stand-in's ``probe`` in the library table); an exception
means it cannot work here, and the stand-in is served instead.
"""

from __future__ import annotations

from typing import Optional

from ..tables.libraries import StandIn


def why_not_working(stand_in: StandIn, module, device) -> Optional[str]:
    """None if the real package (imported as ``module``) works on ``device``, else why not."""
    if stand_in.probe is None:
        return None
    try:
        stand_in.probe(module, device)
    except Exception as exc:                  # any failure of the real package is the answer
        first_line = (str(exc).strip().splitlines() or [""])[0][:160]
        return f"it fails on {device.type}: {type(exc).__name__}: {first_line}"
    return None
