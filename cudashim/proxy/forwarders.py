"""``torch.cuda`` functions that the backend answers, generated from the Backend interface.

A backend method marked ``@cuda_api`` answers the ``torch.cuda`` function of its name. Its
``index`` parameter is torch.cuda's ``device`` argument: ``None`` (the current device), an
index, ``"cuda:N"`` or a ``torch.device`` of type cuda, and also the target's own devices,
since translated tensors report those. Everything else passes through unchanged.
"""

from __future__ import annotations

import functools
import inspect
from typing import Optional, Tuple

import torch

from ..backends.base import Backend, cuda_api_names


def device_index(backend, device, optional: bool = True) -> Optional[int]:
    """The CUDA index a torch.cuda device argument names (None: the current device)."""
    if device is None:
        if optional:
            return None
        raise ValueError("Expected a cuda device, but got: None")
    if isinstance(device, int) and not isinstance(device, bool):
        return device
    parsed = device if isinstance(device, torch._C.device) else torch._C.device(device)
    if parsed.type not in ("cuda", backend.device_type):
        raise ValueError(f"Expected a cuda device, but got: {parsed}")
    return parsed.index


@functools.lru_cache(maxsize=None)
def forwarded_names() -> Tuple[str, ...]:
    """The ``torch.cuda`` names the Backend interface answers (the interface is fixed: read
    once, as the proxy asks for every name it classifies)."""
    return cuda_api_names(Backend)


def forwarder(backend, method_name: str, public_name: Optional[str] = None):
    """``torch.cuda.<public_name>`` answered by ``backend.<method_name>``."""
    public_name = public_name or method_name
    method = getattr(backend, method_name)
    if not callable(method) or isinstance(method, type):
        return method                                   # Stream, Event: the classes themselves
    parameters = list(inspect.signature(method).parameters.values())
    names = [p.name for p in parameters]
    if "index" not in names:
        if public_name == method_name:
            # nothing to convert: the method itself, or the same answer without a frame
            return backend.native_answers().get(method_name, method)

        def forward(*args, **kwargs):
            return method(*args, **kwargs)
    else:
        position = names.index("index")
        optional = parameters[position].default is not inspect.Parameter.empty
        to_index = functools.partial(device_index, backend, optional=optional)

        def forward(*args, **kwargs):
            if len(args) > position:
                args = args[:position] + (to_index(args[position]),) + args[position + 1:]
            else:
                kwargs["index"] = to_index(kwargs.pop("device", None))
            return method(*args, **kwargs)
    forward.__name__ = forward.__qualname__ = public_name
    forward.__doc__ = method.__doc__
    forward.__module__ = "torch.cuda"
    return forward


class forwarded_as:
    """In an implementation class: ``memory_cached = forwarded_as("memory_reserved")``, a
    torch.cuda alias answered by another backend method."""

    def __init__(self, method_name: str):
        self.method_name = method_name

    def __set_name__(self, owner, name):
        self.public_name = name

    def __get__(self, implementation, owner=None):
        if implementation is None:
            return self
        return forwarder(implementation.backend, self.method_name, self.public_name)
