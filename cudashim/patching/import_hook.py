"""``ImportHook``: an import hook of one activation, first on ``sys.meta_path`` while it is live.

Both hooks that serve stand-ins under other packages' names (the CUDA-only libraries',
``substitutes/finder.py``; DeepSpeed's NCCL 1-bit backend) are one: ``install`` puts the hook
first and records its removal in the registry, ``find_spec`` answers only while the activation
is live (an import after deactivation meets the real package), and ``remove`` takes the hook
out and forgets what it served.
"""

from __future__ import annotations

import importlib.abc
import sys


class ImportHook(importlib.abc.MetaPathFinder):
    description = "an import hook"                 # what the registry's undo says

    def __init__(self, activation):
        self.activation = activation

    def install(self) -> None:
        sys.meta_path.insert(0, self)
        self.activation.registry.add_undo(self.description, self.remove)

    def find_spec(self, fullname, path=None, target=None):
        if not self.activation.live:
            return None
        return self.spec_for(fullname)

    def spec_for(self, fullname):
        """The spec this hook serves ``fullname`` with, or None to leave it to the others."""
        raise NotImplementedError

    def remove(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        self.forget()

    def forget(self) -> None:
        """Take what this hook served out of ``sys.modules``, so a later import meets the
        real package (or its absence) again."""
