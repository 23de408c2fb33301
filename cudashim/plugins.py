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
    # importlib.metadata's entry_points() parses every installed distribution's entry points:
    # about 0.1 ms each (6 ms for 58 distributions, 8 for 94, more in a large image) on every
    # activation. A distribution whose entry_points.txt has no section named for a group of
    # ours declares none, and reading the text alone costs under half as much (3 and 4 ms);
    # the few that do are parsed by importlib.metadata as entry_points() parses them: the first
    # distribution of each name on the path, which shadows any later one.
    from importlib.metadata import distribution, distributions
    found, names = [], set()
    for dist in distributions():
        if "[cudashim." not in (dist.read_text("entry_points.txt") or ""):     # no group of ours
            continue
        name = dist.metadata["Name"]
        if name is None:               # no metadata, so nothing shadows it: its own entry points
            found.extend(dist.entry_points)
        elif name not in names:        # the first of its name on the path, as entry_points() reads
            names.add(name)
            found.extend(distribution(name).entry_points)
    return {group: tuple(entry for entry in found if entry.group == group)
            for group in (BACKENDS, PATCH_GROUPS)}


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
