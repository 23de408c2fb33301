"""``inspect.signature``, answered at once where a C function has no signature to read.

Most of torch's functions are C bindings without a text signature. ``inspect.signature``
finds that out the long way (two AttributeErrors, then a ValueError: about 12 µs a call), and
activation asks it of a few hundred of them. ``leading_parameters`` names the keywords a call may
give a function's leading tensor by, where the wrappers that read it by position look for it.
"""

from __future__ import annotations

import inspect
import types
from typing import Optional, Tuple

from .. import torch_names

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


# The names torch's Python argument parser takes for an operator binding's ``input`` (its
# ``self``): NumPy's, besides its own (``torch.softmax(x=t, dim=-1)``).
_INPUT_NAMES = ("input", "x", "a", "x1")


def leading_parameters(function, position: int) -> Tuple[str, ...]:
    """The keywords a call may give ``function``'s argument at ``position`` by
    (``F.linear(input=x, weight=w)``, ``F.scaled_dot_product_attention(query=q, ...)``): its
    signature's name for it, else its operator's schemas' (an operator's ``self`` is ``input``
    to torch's Python bindings, which take NumPy's names for it too); none where no one
    positional parameter is there."""
    found = signature(function)
    if found is not None:
        parameters = list(found.parameters.values())
        if position < len(parameters) and parameters[position].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
            return (parameters[position].name,)
        return ()
    schemas_of = torch_names.get("torch._C._jit_get_schemas_for_operator", None)
    name = getattr(function, "__name__", "")
    if schemas_of is None or not name:
        return ()
    try:
        schemas = schemas_of(f"aten::{name}")
    except RuntimeError:
        return ()
    names = {schema.arguments[position].name for schema in schemas if len(schema.arguments) > position}
    if names and names <= {"self", *_INPUT_NAMES}:      # TorchScript's pow.int(int a, int b) too
        return _INPUT_NAMES
    if len(names) != 1:                    # none, or overloads that disagree (torch._VF.lstm)
        return ()
    return tuple(names)
