"""``inspect.signature``, answered at once where a C function has no signature to read.

Most of torch's functions are C bindings without a text signature. ``inspect.signature``
finds that out the long way (two AttributeErrors, then a ValueError: about 12 µs a call), and
activation asks it of a few hundred of them.
"""

from __future__ import annotations

import inspect
import types
from typing import Optional

# The types of C callables whose signature can only come from ``__text_signature__``.
_C_CALLABLES = (types.BuiltinFunctionType, types.MethodDescriptorType, types.WrapperDescriptorType,
                types.MethodWrapperType, types.ClassMethodDescriptorType)


def signature(function) -> Optional[inspect.Signature]:
    """``inspect.signature(function)``, or None where it has none."""
    if type(function) in _C_CALLABLES and getattr(function, "__text_signature__", None) is None:
        return None
    try:
        return inspect.signature(function)
    except (TypeError, ValueError):
        return None
