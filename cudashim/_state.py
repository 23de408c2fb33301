"""Process-wide state: the patch registry and what activation chose.

The library reaches originals through ``REGISTRY``, so its own detection never sees its
own lies.
"""

from __future__ import annotations

import threading

from .patching import PatchRegistry

REGISTRY = PatchRegistry()
LOCK = threading.RLock()


class _Active:
    settings = None      # the Settings in force, once activate() was called
    backend = None       # the Backend instance, once torch is patched
    reason = ""          # why that backend was chosen
    armed = False        # activate() called; patches wait for torch to be imported


ACTIVE = _Active()


def real(owner, name):
    """The attribute as it was before cudashim patched it."""
    return REGISTRY.original(owner, name)
