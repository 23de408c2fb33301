"""Enumerates every device parameter of torch's public API and classifies it by the tables.

What each parameter is, and the tables of delegated and untouched ones, are
``tables/device_parameters.py``'s; the translated ones are read from the patch groups'
declarations (``REWRITES``, ``TRANSLATES``). ``tests/test_device_parameters.py`` runs it.
"""

from __future__ import annotations

import importlib
import inspect
import re
import types
from typing import Dict, Iterator, NamedTuple, Optional, Tuple

import torch
import wrapt

from ..tables.device_parameters import DELEGATED, DELEGATED_TO, SCOPE_MODULES, SCOPE_PACKAGES, TRANSLATED, \
    UNTOUCHED, UNTOUCHED_BECAUSE, VOCABULARY
from .signatures import signature


class Parameter(NamedTuple):
    name: str               # where the program reaches it: "torch.random.fork_rng"
    owner: object           # the function (or method) that takes it
    parameter: str


def enumerate_parameters() -> Iterator[Parameter]:
    """Every device parameter in scope, each function once (the first public name wins)."""
    seen = set()
    for name, function in _public_functions():
        for parameter in _parameter_names(name, function):
            if parameter in VOCABULARY and (id(function), parameter) not in seen:
                seen.add((id(function), parameter))
                yield Parameter(name, function, parameter)


def classify(parameter: Parameter, tables) -> Optional[Tuple[str, str]]:
    """(kind, how or why) for one parameter; None when it is not classified. ``tables`` is
    ``classification_tables()``."""
    key = (id(parameter.owner), parameter.parameter)
    for kind, table in tables.items():
        if key in table:
            return kind, table[key]
    if _is_module_constructor(parameter.owner):
        return DELEGATED, "a module's constructor passes device to its factories, which translate"
    return None


def translated_parameters() -> Dict[Tuple[int, str], str]:
    """(id(function), parameter) -> the group that translates it, from every group's
    declarations."""
    from ..patches import GROUPS, group_module

    found = {}
    for group in GROUPS:
        module = group_module(group)
        pairs = [(d.target, a.parameter) for d in getattr(module, "REWRITES", ()) for a in d.arguments]
        pairs += list(getattr(module, "TRANSLATES", ()))
        for target, parameter in pairs:
            function = resolve(target)
            if function is not None:
                found[(id(function), parameter)] = f"by the '{group}' group"
    return found


def classification_tables() -> Dict[str, Dict[Tuple[int, str], str]]:
    """{kind: {(id(function), parameter): how or why}} for the declared and listed kinds.
    Functions are known by identity: build the tables and enumerate while cudashim is not
    active (active, the names resolve to the replacements)."""
    return {TRANSLATED: translated_parameters(), DELEGATED: _keyed(DELEGATED_TO),
            UNTOUCHED: _keyed(UNTOUCHED_BECAUSE)}


def _keyed(table: Dict[str, str]) -> Dict[Tuple[int, str], str]:
    found = {}
    for entry, reason in table.items():
        target, parameter = split_entry(entry)
        function = resolve(target)
        if function is not None:
            found[(id(function), parameter)] = reason
    return found


def split_entry(entry: str) -> Tuple[str, str]:
    """"module:path(parameter)" -> ("module:path", "parameter")."""
    target, _, parameter = entry.rstrip(")").partition("(")
    return target, parameter


def resolve(target: str):
    """The function behind "module:attribute.path", unwrapped from staticmethod; None when
    this torch lacks it."""
    module_name, _, path = target.partition(":")
    try:
        value = wrapt.resolve_path(importlib.import_module(module_name), path)[2]
    except (ImportError, AttributeError):
        return None
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value


# --- finding them ------------------------------------------------------------------------
def _public_functions():
    """(public name, function) for the functions, classes' own methods and C operators in
    scope."""
    from ..tables.cuda_surface import public_names, real_submodules

    # Tensor's methods first: legacy tensor types (torch.FloatTensor) hold the same ones.
    yield from _methods("torch.Tensor", torch.Tensor)
    modules = [importlib.import_module(name) for name in SCOPE_MODULES]
    for package in SCOPE_PACKAGES:
        modules.extend(module for module in real_submodules(importlib.import_module(package))
                       if ".examples" not in module.__name__)        # sample scripts, no API
    for module in modules:
        for attribute in public_names(module):
            value = getattr(module, attribute, None)
            if value is None or isinstance(value, types.ModuleType):
                continue
            name = f"{module.__name__}.{attribute}"
            if isinstance(value, type):
                yield from _methods(name, value)
            elif callable(value):
                yield name, value
    yield from _operators()


def _methods(name, cls):
    if not (cls.__module__ or "").startswith("torch"):
        return
    if cls is torch._C.Generator:
        yield name, cls                  # a C class: its constructor is the class itself
    # A class's own methods; for Tensor and UntypedStorage, their C++ bases' too.
    owners = [cls, *_C_BASES.get(cls, ())]
    for owner in owners:
        for attribute, value in vars(owner).items():
            if attribute.startswith("_") and attribute not in ("__init__", "__new__"):
                continue
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            if isinstance(value, (types.FunctionType, types.MethodDescriptorType,
                                  types.BuiltinFunctionType)):
                yield f"{name}.{attribute}", value


_C_BASES = {torch.Tensor: (torch._C.TensorBase,), torch.UntypedStorage: (torch._C.StorageBase,)}


def _operators():
    """The C++ functions and Tensor methods whose operator schema takes a device."""
    for schema in torch._C._jit_get_all_schemas():
        namespace, _, op = schema.name.partition("::")
        if namespace != "aten" or op.startswith("_"):
            continue
        if not any(a.name in VOCABULARY and "Device" in str(a.type) for a in schema.arguments):
            continue
        for owner, attribute, label in _bindings(op):
            yield f"{label}.{attribute}", getattr(owner, attribute)


def _bindings(op):
    """Where torch binds operator ``op`` for Python: torch.X, Tensor.X, torch.fft.X, ..."""
    for prefix, owner, label in (("fft_", torch.fft, "torch.fft"), ("special_", torch.special,
                                                                     "torch.special")):
        if op.startswith(prefix) and hasattr(owner, op[len(prefix):]):
            yield owner, op[len(prefix):], label
    if hasattr(torch, op) and not isinstance(getattr(torch, op), types.ModuleType):
        yield torch, op, "torch"
    if hasattr(torch.Tensor, op):
        yield torch.Tensor, op, "torch.Tensor"


def _parameter_names(name, function):
    return sorted(parameters_of(function) or ())


def parameters_of(function):
    """The parameter names torch gives ``function``: from its signature, or for C++ code
    from its operator schemas and its documented signature; None where torch says nothing."""
    found = signature(function)
    parameters = None if found is None else found.parameters.values()
    if parameters is not None and not any(p.kind == p.VAR_KEYWORD for p in parameters):
        return {p.name for p in parameters}
    names = set(_schema_parameters(function)) | _documented_parameters(function)
    if parameters is not None:
        names |= {p.name for p in parameters}
    return names or None


def takes(function, parameter: str) -> bool:
    """Whether ``parameter`` is among ``parameters_of(function)``, reading its sources only
    until one names it: an operator's schema mostly does, and the docstring, the costliest to
    read, is then left unread (activation asks this of every constructor)."""
    found = signature(function)
    parameters = None if found is None else found.parameters
    if parameters is not None:
        if parameter in parameters:
            return True
        if not any(p.kind == p.VAR_KEYWORD for p in parameters.values()):
            return False
    return parameter in _schema_parameters(function) or parameter in _documented_parameters(function)


def _documented_parameters(function):
    """The names in the signatures a docstring documents, as torch's C++ functions
    ("cuda(device=None, non_blocking=False, ...) -> Tensor") and overloaded Python methods
    (".. function:: to(device=None, dtype=None, non_blocking=False)") do."""
    name = getattr(function, "__name__", None)
    if not name:
        return set()
    found = set()
    for line in (getattr(function, "__doc__", None) or "").splitlines():
        line = line.strip()
        line = line.removeprefix(".. function:: ").removeprefix(".. method:: ")
        if line.startswith(f"{name}("):
            inside = line[len(name) + 1:].partition(")")[0]
            found.update(re.match(r"\s*\**\s*(\w*)", part).group(1) for part in inside.split(","))
    found.discard("")
    return found


def _schema_parameters(function):
    """The parameters of a C++ operator's binding, from the operator's schemas."""
    op = getattr(function, "__name__", "")
    if not op or not any(getattr(owner, name, None) is function for owner, name, _ in _bindings(op)):
        return []                           # not an operator's binding (a Python wrapper, say)
    names = set()
    for schema in torch._C._jit_get_schemas_for_operator(f"aten::{op}"):
        names.update(a.name for a in schema.arguments)
    return sorted(names)


def _is_module_constructor(function) -> bool:
    qualname = getattr(function, "__qualname__", "")
    if not qualname.endswith((".__init__", ".__new__")):
        return False
    module = inspect.getmodule(function)
    owner = getattr(module, qualname.split(".")[0], None)
    return isinstance(owner, type) and issubclass(owner, torch.nn.Module)
