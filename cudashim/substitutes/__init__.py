"""Stand-ins for the CUDA-only libraries CUDA programs import, served only where the real
package cannot work on the target.

A program is often CUDA-only because of an import (``from flash_attn import flash_attn_func``,
``from apex.optimizers import FusedAdam``, ``import pynvml``): off CUDA the package is absent,
fails to load its CUDA library, or loads and fails at its first call. ``finder.py`` is the
import hook that decides, per library, at its first import: the real package is imported
first and tried on the target (``probes.py``); if it is absent, fails to import or fails the
try, the stand-in in this folder is served under the real name. Each stand-in is built on
torch's own operations (``scaled_dot_product_attention``, ``torch.optim``, ``torch.amp``,
``torch.nn.LayerNorm``), so it runs on every target.

``LIBRARIES`` holds the stand-ins of the one library table (``cudashim/tables/libraries.py``):
``--substitute`` checks names against it, the finder serves from it, ``doctor`` and ``cudashim
scan`` read it. This module imports no torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Dict, Tuple

from ..tables.libraries import STAND_INS, StandIn

HERE = Path(__file__).resolve().parent
LIBRARIES: Dict[str, StandIn] = STAND_INS


def names() -> Tuple[str, ...]:
    return tuple(LIBRARIES)


def library_of(module: str):
    """The Library that serves the top-level import name of ``module``, or None."""
    top = module.partition(".")[0]
    for library in LIBRARIES.values():
        if top in library.modules:
            return library
    return None


def source_of(module: str) -> Path:
    """The stand-in's file for a top-level import name: a package's ``__init__.py`` or a
    module file."""
    package = HERE / module / "__init__.py"
    return package if package.exists() else HERE / f"{module}.py"


def provides(module: str) -> bool:
    """Whether the stand-ins have a file for the dotted module name (``flash_attn.bert_padding``)."""
    path = HERE.joinpath(*module.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()



def serving_activation():
    """The activation whose import hook (``finder.SubstituteFinder``) serves the stand-ins, or
    None: a stand-in asks the object that served it what it runs on."""
    for finder in sys.meta_path:
        activation = getattr(finder, "serving_for", None)
        if activation is not None and activation.live:
            return activation
    return None
