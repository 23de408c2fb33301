"""``Refusal``: an API the target cannot serve, harmless or refused, under one policy.

A harmless API (a profiler range, a tuning switch) does nothing under ``unsupported="warn"``,
the default: one warning, and the report counts a no-op. Everything else, and a harmless API
under ``unsupported="raise"``, raises ``UnsupportedCudaAPI`` naming the way out, and the report
counts a refusal.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from ..errors import UnsupportedCudaAPI, warn_once


class Refusal(NamedTuple):
    api: str                         # the CUDA API, as the program names it
    way_out: str                     # what to call instead
    harmless: bool = False           # doing nothing keeps the program right
    nothing: str = "does nothing"    # what doing nothing means, for the warning

    def meet(self, activation) -> None:
        """Refuse (raise), or, where harmless and allowed, warn once and return."""
        backend = activation.backend
        if self.harmless and activation.settings.unsupported == "warn":
            warn_once(self.api, f"{self.api} {self.nothing} on the '{backend.name}' backend ({self.way_out})")
            activation.count(self.api, "no-op")
            return
        activation.count(self.api, "refused")
        raise UnsupportedCudaAPI(self.api, backend.name, self.way_out)


def stand_in(activation, refusal: Refusal, is_class: bool = False, answer: Any = None,
             real: Any = None):
    """What the program calls in place of the API: a function (or, to keep ``isinstance``
    working, a class that cannot be made) meeting the refusal, returning ``answer`` where it
    is harmless. Where the API's ``real`` object is known, the stand-in carries its name,
    module, docstring and signature (``__wrapped__``), as torch and libraries read them."""

    def refuse(*args, **kwargs):
        refusal.meet(activation)
        return answer() if callable(answer) else answer

    module, _, name = refusal.api.rpartition(".")
    if is_class:
        names = {"__module__": getattr(real, "__module__", module),
                 "__qualname__": getattr(real, "__qualname__", name), "__doc__": getattr(real, "__doc__", None)}
        if hasattr(real, "__enter__"):       # a context manager class stays one
            names.update(__enter__=lambda self: refuse(), __exit__=lambda self, *exc: refuse())
        return type(name, (), {"__new__": lambda cls, *a, **k: refuse(*a, **k), **names})
    refuse.__name__ = refuse.__qualname__ = name
    if callable(real):
        functools.update_wrapper(refuse, real)
    return refuse
