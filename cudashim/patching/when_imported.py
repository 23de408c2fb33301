"""``WhenImported``: a patch made when its module is imported, while the activation is live.

A module imported already is patched at once; one imported later, by the post-import hook the
activation keeps (``Activation.when_imported``), which forgets the patch at deactivation, so an
import after it patches nothing.
"""

from __future__ import annotations

import functools
import types
from typing import Any, Callable, NamedTuple


class WhenImported(NamedTuple):
    module: str                                          # the module's name
    patch: Callable[[Any, types.ModuleType], None]       # (activation, module)


def apply(activation, declaration: WhenImported) -> None:
    activation.when_imported(declaration.module, functools.partial(declaration.patch, activation))
