"""Classifies a public name of the real ``torch.cuda``: the code that provides it, else the table.

The table of names that need a reason, and the kinds, are ``tables/cuda_surface.py``'s; the
kinds the code decides (BACKEND, SHIM, SUBMODULE) are read from the forwarders and the
implementations here.
"""

from __future__ import annotations

import types

from ..tables.cuda_surface import BACKEND, SHIM, SUBMODULE, SURFACE, enclosing_owner


def classify(real_top: types.ModuleType, module: types.ModuleType, name: str):
    """(kind, way out) for ``module.name``; None when it is not classified."""
    from .forwarders import forwarded_names
    from .implementation import IMPLEMENTATIONS

    implementation = IMPLEMENTATIONS.get(module.__name__)
    if implementation is not None and name in implementation.implements():
        return (SHIM, None)
    if module.__name__ == real_top.__name__ and name in forwarded_names():
        return (BACKEND, None)
    table = SURFACE.get(module.__name__, {})
    if name in table:
        return table[name]
    value = getattr(module, name, None)
    enclosing = enclosing_owner(real_top, module, name)
    if enclosing is not None:
        return classify(real_top, enclosing, name)
    if isinstance(value, types.ModuleType) and value.__name__.startswith(real_top.__name__ + "."):
        return (SUBMODULE, None)
    return None
