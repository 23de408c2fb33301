"""NCCL's environment variables, read by the collective libraries NCCL becomes.

Job scripts written for NCCL set its variables: the network interface, debug output, how errors
and timeouts surface, transport tuning. ``TABLE`` says once, for each, what it becomes for
each library cudashim maps NCCL to: the variable that library reads (set only where the user
has not set it), or why nothing needs setting. Every process group also holds gloo for host
tensors (``cpu:gloo,<device>:<library>``), so gloo's column applies on every target.
"""

from __future__ import annotations

import logging
import socket
from typing import Callable, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..errors import warn_once

log = logging.getLogger(__name__)

GLOO = "gloo"


class Becomes(NamedTuple):
    """What an NCCL variable becomes for one library: ``variable`` set to ``value(nccl_value)``
    (None: nothing to set), or nothing at all, for the reason ``why``."""
    variable: Optional[str] = None
    value: Callable[[str], Optional[str]] = lambda nccl_value: nccl_value
    why: str = ""


class NcclVariable(NamedTuple):
    names: Tuple[str, ...]                 # the variable and its older or newer spellings
    meaning: str
    libraries: Dict[str, Tuple[Becomes, ...]]   # library -> what it becomes there
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
    """GLOO_SOCKET_IFNAME for an NCCL_SOCKET_IFNAME: gloo takes exact names, and one is enough
    for it to bind and connect."""
    return first_interface(pattern)


def first_interface(pattern: str) -> Optional[str]:
    """For a library that takes one exact interface name: the first NCCL would select."""
    present = machine_interfaces()
    chosen = matching_interfaces(pattern, present)
    if not chosen:
        warn_once("nccl-socket-ifname", f"NCCL_SOCKET_IFNAME={pattern} selects none of this "
                                        f"machine's interfaces ({', '.join(present)}): the library picks its own")
        return None
    return chosen[0]


def _debug_level(nccl_debug: str) -> Optional[str]:
    return "INFO" if nccl_debug.strip().upper() in ("INFO", "TRACE") else None


def _oneccl_log_level(nccl_debug: str) -> Optional[str]:
    """oneCCL's CCL_LOG_LEVEL for NCCL_DEBUG's levels (NCCL's VERSION prints its version only)."""
    return {"WARN": "warn", "INFO": "info", "TRACE": "trace"}.get(nccl_debug.strip().upper())


_WAITS_ON_THE_HOST = ("gloo's collectives run on the host and raise once the process group's "
                      "timeout passes, which is what this asks of NCCL")
_NO_WATCHDOG = ("gloo has no watchdog thread: a collective that never completes raises at the "
                "process group's timeout (init_process_group(timeout=...), which gloo gets as given)")
_NCCL_TUNING = "tunes NCCL's own transports, which the target's library does not have"
_TORCH_NCCL = "configures torch's NCCL process group, which the target's library is not"
HCCL, XCCL = "hccl", "xccl"        # Ascend's and Gaudi's HCCL read the same names; oneCCL's, torch's XCCL

TABLE: Tuple[NcclVariable, ...] = (
    NcclVariable(("NCCL_SOCKET_IFNAME",), "the network interface(s) to use",
                 {GLOO: (Becomes("GLOO_SOCKET_IFNAME", gloo_interface),),
                  HCCL: (Becomes("HCCL_SOCKET_IFNAME"),),          # HCCL reads NCCL's syntax itself
                  XCCL: (Becomes("CCL_KVS_IFACE", first_interface), Becomes("FI_TCP_IFACE", first_interface))},
                 "the library chooses its own interface"),
    NcclVariable(("NCCL_DEBUG",), "NCCL's log level",
                 {GLOO: (Becomes("TORCH_DISTRIBUTED_DEBUG", _debug_level),),
                  XCCL: (Becomes("CCL_LOG_LEVEL", _oneccl_log_level),)},
                 "the library keeps its own log level"),
    NcclVariable(("TORCH_NCCL_ASYNC_ERROR_HANDLING", "NCCL_ASYNC_ERROR_HANDLING"),
                 "tear down the job when a collective fails or times out",
                 {GLOO: (Becomes(why=_WAITS_ON_THE_HOST),),
                  HCCL: (Becomes("HCCL_ASYNC_ERROR_HANDLING"),),
                  XCCL: (Becomes("TORCH_XCCL_ASYNC_ERROR_HANDLING"),)},
                 "the library reports errors its own way"),
    NcclVariable(("TORCH_NCCL_BLOCKING_WAIT", "NCCL_BLOCKING_WAIT"),
                 "make wait() block and raise at the timeout",
                 {GLOO: (Becomes(why=_WAITS_ON_THE_HOST),),
                  HCCL: (Becomes("TORCH_HCCL_BLOCKING_WAIT"), Becomes("HCCL_BLOCKING_WAIT")),
                  XCCL: (Becomes("TORCH_XCCL_BLOCKING_WAIT"),)},
                 "the library waits its own way"),
    NcclVariable(("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC",),
                 "seconds the watchdog may go unheard before the process is torn down",
                 {GLOO: (Becomes(why=_NO_WATCHDOG),)}, "the library keeps its own timeouts"),
    NcclVariable(("TORCH_NCCL_DESYNC_DEBUG", "NCCL_DESYNC_DEBUG"),
                 "on a timeout, say which rank fell out of step",
                 {GLOO: (Becomes(why="gloo's timeout error names the collective that timed out; "
                                     "TORCH_DISTRIBUTED_DEBUG=DETAIL checks that ranks call the same ones"),),
                  HCCL: (Becomes("HCCL_DESYNC_DEBUG"),)},
                 "the library has no desync report"),
)
_BY_NAME = {name: entry for entry in TABLE for name in entry.names}


def _unlisted(name: str) -> str:
    return _TORCH_NCCL if name.startswith("TORCH_NCCL_") else _NCCL_TUNING


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
        rules = None if entry is None else entry.libraries.get(library)
        if entry is None:
            said.append(f"no effect on {library}: {_unlisted(name)}")
        elif rules is None:
            said.append(f"no effect on {library}: {entry.otherwise}")
        elif rules[0].variable is None:
            said.append(f"nothing to set for {library}: {rules[0].why}")
        else:
            names = " and ".join(rule.variable for rule in rules)
            said.append(f"becomes {names} for {library}, unless {'that is' if len(rules) == 1 else 'they are'} set")
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
                outcomes.append(f"no effect on {library}: {_unlisted(name)}")
                continue
            rules = entry.libraries.get(library)
            if rules is None:
                outcomes.append(f"no effect on {library}: {entry.otherwise}")
            else:
                outcomes += [_becomes(environ, library, rule, value, set_item) for rule in rules]
        if outcomes:
            said = "; ".join(outcomes)
            became.append((name, said))
            log.info("cudashim: %s=%s: %s", name, value, said)
            count(f"${name}", said)
    return became


def _becomes(environ, library, rule, value, set_item) -> str:
    if rule.variable is None:
        return f"nothing to set for {library}: {rule.why}"
    if rule.variable in environ:
        return f"{rule.variable}={environ[rule.variable]} (already set, kept)"
    mapped = rule.value(value)
    if mapped is None:
        return f"{rule.variable} not set"
    set_item(environ, rule.variable, mapped)
    return f"{rule.variable}={mapped}"
