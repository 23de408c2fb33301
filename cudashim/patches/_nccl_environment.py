"""NCCL's environment variables, read by the collective libraries NCCL becomes.

Job scripts written for NCCL set its variables: the network interface, debug output, how errors
and timeouts surface, transport tuning. ``TABLE`` says once, for each, what it becomes for
each library cudashim maps NCCL to: the variable that library reads (set only where the user
has not set it), or why nothing needs setting. Every process group also holds gloo for host
tensors (``cpu:gloo,<device>:<library>``), so gloo's column applies on every target.
"""

from __future__ import annotations

import dataclasses
import logging
import socket
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import warn_once

log = logging.getLogger(__name__)

GLOO = "gloo"


@dataclasses.dataclass(frozen=True)
class Becomes:
    """What an NCCL variable becomes for one library: ``variable`` set to ``value(nccl_value)``
    (None: nothing to set), or nothing at all, for the reason ``why``."""
    variable: Optional[str] = None
    value: Callable[[str], Optional[str]] = lambda nccl_value: nccl_value
    why: str = ""


@dataclasses.dataclass(frozen=True)
class NcclVariable:
    names: Tuple[str, ...]                 # the variable and its older or newer spellings
    meaning: str
    libraries: Dict[str, Becomes]          # library -> what it becomes there
    otherwise: str                         # for a library the table has no column for


def matching_interfaces(pattern: str, names: Sequence[str]) -> List[str]:
    """The interfaces NCCL_SOCKET_IFNAME selects among ``names``, as NCCL reads it: prefixes
    separated by commas; ``=`` before them for exact names, ``^`` to exclude them instead
    (then loopback comes last, as NCCL prefers a real interface)."""
    exclude = pattern.startswith("^")
    pattern = pattern[1:] if exclude else pattern
    exact = pattern.startswith("=")
    pattern = pattern[1:] if exact else pattern
    wanted = [part.strip() for part in pattern.split(",") if part.strip()]

    def named(interface):
        return any(interface == w if exact else interface.startswith(w) for w in wanted)

    if not exclude:
        return [name for name in names if named(name)]
    kept = [name for name in names if not named(name)]
    return sorted(kept, key=lambda name: name.startswith("lo"))


def machine_interfaces() -> List[str]:
    return [name for _, name in socket.if_nameindex()]


def gloo_interface(pattern: str) -> Optional[str]:
    """GLOO_SOCKET_IFNAME for an NCCL_SOCKET_IFNAME: the first interface NCCL would select.
    gloo takes exact names; one is enough for it to bind and connect."""
    present = machine_interfaces()
    chosen = matching_interfaces(pattern, present)
    if not chosen:
        warn_once("nccl-socket-ifname", f"NCCL_SOCKET_IFNAME={pattern} selects none of this "
                                        f"machine's interfaces ({', '.join(present)}): gloo picks its own")
        return None
    return chosen[0]


def _debug_level(nccl_debug: str) -> Optional[str]:
    return "INFO" if nccl_debug.strip().upper() in ("INFO", "TRACE") else None


_WAITS_ON_THE_HOST = ("gloo's collectives run on the host and raise once the process group's "
                      "timeout passes, which is what this asks of NCCL")
_NCCL_TUNING = "tunes NCCL's own transports, which the target's library does not have"

TABLE: Tuple[NcclVariable, ...] = (
    NcclVariable(("NCCL_SOCKET_IFNAME",), "the network interface(s) to use",
                 {GLOO: Becomes("GLOO_SOCKET_IFNAME", gloo_interface),
                  "hccl": Becomes("HCCL_SOCKET_IFNAME")},
                 "the library chooses its own interface"),
    NcclVariable(("NCCL_DEBUG",), "NCCL's log level",
                 {GLOO: Becomes("TORCH_DISTRIBUTED_DEBUG", _debug_level)},
                 "the library keeps its own log level"),
    NcclVariable(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"),
                 "tear down the job when a collective fails or times out",
                 {GLOO: Becomes(why=_WAITS_ON_THE_HOST)}, "the library reports errors its own way"),
    NcclVariable(("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"),
                 "make wait() block and raise at the timeout",
                 {GLOO: Becomes(why=_WAITS_ON_THE_HOST)}, "the library waits its own way"),
)
_BY_NAME = {name: entry for entry in TABLE for name in entry.names}


def is_nccl_variable(name: str) -> bool:
    return name in _BY_NAME or (name.startswith("NCCL_") and name.replace("_", "").isalnum()
                                and name.isupper())


def libraries_of(collective: str) -> List[str]:
    """The libraries whose columns apply where NCCL becomes ``collective``: gloo always (every
    process group holds it for host tensors), and the target's own library."""
    return [GLOO] + ([] if collective in ("staged", GLOO) else [collective])


def describe(name: str, libraries: Sequence[str]) -> str:
    """What the variable ``name`` becomes for ``libraries``, whatever its value (for scan)."""
    entry, said = _BY_NAME.get(name), []
    for library in dict.fromkeys(libraries):
        rule = None if entry is None else entry.libraries.get(library)
        if entry is None:
            said.append(f"no effect on {library}: {_NCCL_TUNING}")
        elif rule is None:
            said.append(f"no effect on {library}: {entry.otherwise}")
        elif rule.variable is None:
            said.append(f"nothing to set for {library}: {rule.why}")
        else:
            said.append(f"becomes {rule.variable} for {library}, unless that is set")
    return "; ".join(said)


def apply(environ, libraries: Sequence[str], set_item,
          count=lambda api, became: None) -> List[Tuple[str, str]]:
    """Map every NCCL variable set in ``environ`` for ``libraries`` (the target's, and gloo);
    ``set_item(environ, name, value)`` records what it sets. Returns [(variable, what it
    became)], also counted (``count``, the report's) under "$NAME"."""
    became = []
    for name in sorted(n for n in environ if n.startswith(("NCCL_", "TORCH_NCCL_"))):
        entry, value = _BY_NAME.get(name), environ[name]
        outcomes = []
        for library in dict.fromkeys(libraries):
            if entry is None:
                if name.startswith("NCCL_"):
                    outcomes.append(f"no effect on {library}: {_NCCL_TUNING}")
                continue
            rule = entry.libraries.get(library)
            outcomes.append(_becomes(environ, library, rule, value, entry, set_item))
        if outcomes:
            said = "; ".join(outcomes)
            became.append((name, said))
            log.info("cudashim: %s=%s: %s", name, value, said)
            count(f"${name}", said)
    return became


def _becomes(environ, library, rule, value, entry, set_item) -> str:
    if rule is None:
        return f"no effect on {library}: {entry.otherwise}"
    if rule.variable is None:
        return f"nothing to set for {library}: {rule.why}"
    if rule.variable in environ:
        return f"{rule.variable}={environ[rule.variable]} (already set, kept)"
    mapped = rule.value(value)
    if mapped is None:
        return f"{rule.variable} not set"
    set_item(environ, rule.variable, mapped)
    return f"{rule.variable}={mapped}"
