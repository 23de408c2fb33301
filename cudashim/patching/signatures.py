"""``inspect.signature``, answered at once where a C function has no signature to read.

Most of torch's functions are C bindings without a text signature. ``inspect.signature``
finds that out the long way (two AttributeErrors, then a ValueError: about 12 µs a call), and
activation asks it of a few hundred of them. ``by_position`` moves the arguments a call gives
by keyword to the positions where the wrappers that read them by position look.
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


# The names torch's Python argument parser takes for an operator binding's parameter besides
# its own: NumPy's (``torch.softmax(x=t, dim=-1)``). A Tensor ``self`` is ``input`` to it.
_ALIASES = {"input": ("input", "x", "a", "x1"), "other": ("other", "x2")}


def leading_parameters(function, position: int) -> Tuple[str, ...]:
    """The keywords a call may give ``function``'s argument at ``position`` by
    (``F.linear(input=x, weight=w)``, ``torch.dot(input=a, tensor=b)``): its signature's name
    for it, else its operator's schemas' with the aliases torch's Python bindings take; none
    where no one positional parameter is there."""
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
    names = set()
    for schema in schemas:
        if len(schema.arguments) > position:
            argument = schema.arguments[position]
            # torch's Python bindings call a ``self`` ``input``, but a list's (``_foreach_norm``)
            listed = str(argument.type).startswith("List")
            names.add("input" if argument.name == "self" and not listed else argument.name)
    if names and names <= set(_ALIASES["input"]):    # TorchScript's pow.int(int a, int b) too
        return _ALIASES["input"]
    if len(names) != 1:                    # none, or overloads that disagree (torch._VF.lstm)
        return ()
    named = names.pop()
    return _ALIASES.get(named, (named,))


# (function, position) -> leading_parameters(function, position), found at the first call that
# needs them: few programs give these arguments by keyword, and activation need not ask.
_LEADING = {}


def by_position(function, count: int, args: tuple, kwargs: dict):
    """``(args, kwargs)`` of a call of ``function`` with its first ``count`` arguments that
    ``kwargs`` gives by name moved to their positions, for wrappers that read them by position;
    as far as they are given in order."""
    if len(args) >= count or not kwargs:
        return args, kwargs
    args, kwargs = list(args), dict(kwargs)
    for position in range(len(args), count):
        names = _LEADING.get((function, position))
        if names is None:
            names = _LEADING[function, position] = leading_parameters(function, position)
        name = next((name for name in names if name in kwargs), None)
        if name is None:
            break
        args.append(kwargs.pop(name))
    return tuple(args), kwargs
