"""Refusals for what a stand-in does not provide: one error, naming the way out."""

from __future__ import annotations

from typing import Callable, Mapping

from ..errors import UnsupportedCudaImport
from . import serving_activation


def backend_name() -> str:
    activation = serving_activation()
    return activation.backend.name if activation is not None else "cpu"


def refusal(api: str, way_out: str) -> UnsupportedCudaImport:
    return UnsupportedCudaImport(api, backend_name(), f"cudashim's stand-in does not provide it; "
                                                      f"{way_out}")


def refusing_getattr(module: str, refused: Mapping[str, str]) -> Callable[[str], object]:
    """A module ``__getattr__``: the names in ``refused`` (name -> way out) raise the
    refusal; every other missing name is an AttributeError, so ``hasattr`` keeps working."""
    def __getattr__(name):
        if name in refused:
            raise refusal(f"{module}.{name}", refused[name])
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return __getattr__
