"""The kernel registry: one portable implementation per op, fast paths per device type.

A call dispatches on its first tensor's ``device.type``. A fast path may need a library
that is missing or broken on this machine, so each declares an availability check, asked
once; and before its first use on a device type it is run once against the portable
version on a small probe, so a fast path whose semantics differ never corrupts data.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Callable, Dict, Optional

log = logging.getLogger(__name__)


@dataclasses.dataclass(eq=False)           # one registration: identity, not value
class FastPath:
    function: Callable
    name: str
    available: Callable[[], Optional[str]]     # None when usable, else why not (asked once)
    wanted: Callable[[], bool]                 # asked at each call: a setting may turn it off
    state: Optional[str] = None                # None: not checked yet; "ok"; or the reason


class KernelOp:
    """A named op: ``op(tensor, ...)`` runs the fast path for the tensor's device type, if
    one is registered and usable, else the portable implementation."""

    def __init__(self, name: str, portable: Callable, probe: Callable = None,
                 same: Callable = None):
        self.name = name
        self.portable = portable
        self.probe = probe                     # device -> [args, ...] for the one-time check
        self.same = same                       # (fast result, portable result) -> bool
        self.fast_paths: Dict[str, FastPath] = {}
        self._lock = threading.Lock()
        self.__doc__ = portable.__doc__
        self.__name__ = name

    def register(self, device_type: str, function: Callable, name: str = None,
                 available: Callable[[], Optional[str]] = None, wanted: Callable[[], bool] = None) -> None:
        self.fast_paths[device_type] = FastPath(
            function, name or getattr(function, "__name__", "fast path"),
            available or (lambda: None), wanted or (lambda: True))

    def implementation(self, device_type: str, device=None) -> Callable:
        fast = self.fast_paths.get(device_type)
        if fast is None:
            return self.portable
        if fast.state is None:
            with self._lock:
                if fast.state is None:
                    fast.state = self._check(fast, device)
        return fast.function if fast.state == "ok" and fast.wanted() else self.portable

    def _check(self, fast: FastPath, device) -> str:
        try:
            reason = fast.available()
        except Exception as exc:               # a broken vendor install
            reason = f"{type(exc).__name__}: {exc}"
        if reason is None and self.probe is not None and device is not None:
            try:
                for args in self.probe(device):
                    if not self.same(fast.function(*args), self.portable(*args)):
                        reason = f"disagrees with the portable version on a probe input {args[1:]}"
                        break
            except Exception as exc:
                reason = f"failed on the probe input: {type(exc).__name__}: {exc}"
        if reason is not None:
            log.warning("cudashim.kernels: %s fast path %s not used: %s", self.name, fast.name, reason)
            return reason
        return "ok"

    def __call__(self, tensor, *args, **kwargs):
        device = tensor.device
        return self.implementation(device.type, device)(tensor, *args, **kwargs)

    def describe(self) -> Dict[str, str]:
        return {device_type: f"{fast.name}: " + (fast.state or "not checked yet")
                for device_type, fast in self.fast_paths.items()}


OPS: Dict[str, KernelOp] = {}


def define(name: str, portable: Callable, probe: Callable = None, same: Callable = None) -> KernelOp:
    op = KernelOp(name, portable, probe, same)
    OPS[name] = op
    return op


def register_kernel(op: str, device_type: str, function: Callable,
                    available: Callable[[], Optional[str]] = None, name: str = None,
                    wanted: Callable[[], bool] = None) -> None:
    """Register ``function`` as ``op``'s fast path on ``device_type`` (one call, for users
    and vendors). ``available()`` returns None when it can run here, else the reason;
    ``wanted()``, asked at each call, may turn it off for a while (a setting)."""
    if op not in OPS:
        raise KeyError(f"unknown kernel op '{op}'; known: {', '.join(sorted(OPS))}")
    OPS[op].register(device_type, function, name, available, wanted)


def kernel_info() -> Dict[str, Dict[str, str]]:
    """{op: {device type: fast path and its state}}."""
    return {name: op.describe() for name, op in sorted(OPS.items())}
