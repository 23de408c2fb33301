"""``ByCaller``: the answer depends on who asks.

Who hears the truth (``activation.callers``: torch's own modules, the libraries that load CUDA
code) calls the real function, so torch behaves exactly as it does without cudashim (inductor,
for one, branches on what ``torch.cuda`` raises); the program and its other libraries call
ours. While the report is on it records who heard what and counts what the others heard; while
it is off a compiled switch decides without a Python frame where the fast path is built.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional, Union

import wrapt

from ..callers import asking_module

# What the report says the others heard: a fixed text, or one made from the answer.
Became = Union[str, Callable[[Any], str], None]


class ByCaller(NamedTuple):
    """``target`` answers by who asks: the honest call the original, everyone else ``ours``."""
    target: str                                  # "module:attribute.path"
    ours: Callable                               # (activation, original) -> what the others call
    became: Union[Became, Callable] = None       # the report's row for the others (None: only who heard)
    api: Optional[str] = None                    # the report's name; default the target's
    torch_only: bool = False                     # only torch's own modules hear the original
    optional: bool = False                       # absent in some torch releases: then left alone

    @property
    def api_name(self) -> str:
        module, _, path = self.target.partition(":")
        return self.api or f"{module}.{path}"


def apply(activation, declaration: ByCaller) -> None:
    import importlib

    module, _, path = declaration.target.partition(":")
    try:
        owner, name, original = wrapt.resolve_path(importlib.import_module(module), path)
    except AttributeError:
        if declaration.optional:
            return
        raise
    ours = declaration.ours(activation, original)
    activation.registry.set_attr(owner, name, answer_by_caller(
        activation, declaration.api_name, original, ours, declaration.became,
        torch_only=declaration.torch_only, method=isinstance(owner, type)))


def answer_by_caller(activation, api: str, real: Callable, ours: Callable, became: Became = None, *,
                     torch_only: bool = False, depth: int = 2, method: bool = False) -> Callable:
    """A function calling ``real`` for the honest and ``ours`` for the others. ``depth`` says
    where the asker is: 2 when the program calls the result, 3 when the result is called by a
    property or a wrapper the program reached. A ``method`` stays a Python function, which
    binds to its instance (the compiled switch does not)."""
    callers, report, compiled = activation.callers, activation.report, activation.compiled
    honest = callers.asked_by_torch if torch_only else callers.hears_truth
    asker = depth                                # frames up from ``function`` below
    if report is None:
        def function(*args, **kwargs):
            return real(*args, **kwargs) if honest(asker) else ours(*args, **kwargs)
    else:
        def function(*args, **kwargs):
            heard = honest(asker)
            report.heard(api, asking_module(asker), heard)
            if heard:
                return real(*args, **kwargs)
            answer = ours(*args, **kwargs)
            if became is not None:
                report.count(api, became(answer) if callable(became) else became)
            return answer

    function = _named_like(function, ours, real)
    if compiled is None or report is not None or torch_only or depth != 2 or method:
        return function
    switch = _named_like(compiled.TruthSwitch(callers.compiled_cache(compiled), real, ours), ours, real)
    switch.python_twin = function
    return switch


def _named_like(function, ours, real):
    """``function`` dressed as ``real``, as ``functools.wraps`` dresses a wrapper: torch and
    libraries read these (torch 2.14's dynamo reads ``torch.cuda.use_mem_pool.__wrapped__`` when
    it is imported; ``inspect.signature`` follows ``__wrapped__`` to the real parameters)."""
    function.__name__ = getattr(real, "__name__", None) or ours.__name__
    function.__qualname__ = getattr(real, "__qualname__", None) or function.__name__
    function.__module__ = getattr(real, "__module__", None) or getattr(ours, "__module__", None)
    function.__doc__ = getattr(real, "__doc__", None) or ours.__doc__
    function.__wrapped__ = real
    function.cudashim_answer = ours        # the answer itself, for callers that are never torch's
    return function


def value_by_caller(activation, api: str, real: Callable[[], Any], ours: Any, became: Became = None):
    """A getter for a property whose value depends on who reads it (``torch.version.cuda``):
    the honest read ``real()``, the others ``ours``."""
    return answer_by_caller(activation, api, real, functools.wraps(real)(lambda: ours), became, depth=3)
