"""What other packages add to cudashim through entry points: backends and patch groups.

A package declares ``[project.entry-points."cudashim.backends"]`` (``name =
"package.module:BackendClass"``) or ``[project.entry-points."cudashim.patch_groups"]`` (``name =
"package.module"``, a module written as cudashim's own groups are), as torch's own
``torch.backends`` entry points and DeepSpeed's ``set_accelerator`` let vendors plug in. The
installed distributions are read once per process, for both groups together, and only when
asked.
"""

from __future__ import annotations

import functools
import logging
from typing import Collection, Dict, Tuple

log = logging.getLogger(__name__)

BACKENDS = "cudashim.backends"
PATCH_GROUPS = "cudashim.patch_groups"


@functools.lru_cache(maxsize=None)
def _entry_points() -> Dict[str, Tuple]:
    from importlib.metadata import entry_points
    found = entry_points()
    if hasattr(found, "select"):
        return {group: tuple(found.select(group=group)) for group in (BACKENDS, PATCH_GROUPS)}
    return {group: tuple(found.get(group, ())) for group in (BACKENDS, PATCH_GROUPS)}   # Python 3.9


def registered(group: str, built_in: Collection[str]) -> Dict[str, str]:
    """name -> where it lives ("module" or "module:attribute"), for every entry point of
    ``group``; a name cudashim has built in stays cudashim's, with a warning."""
    table = {}
    for entry in _entry_points()[group]:
        if entry.name in built_in:
            log.warning("cudashim: ignoring the %s entry point %r: the name %r is built in",
                        group, entry.value, entry.name)
            continue
        table[entry.name] = entry.value
    return table
