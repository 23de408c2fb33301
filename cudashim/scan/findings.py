"""One finding of ``cudashim scan``, and the classes a finding falls in."""

from __future__ import annotations

import dataclasses
from typing import Optional

HANDLED = "handled"                  # cudashim redirects it at run time
NEEDS_CHANGE = "needs a change"      # no runtime shim can catch it: the program must change
CANNOT_RUN = "cannot run here"       # native CUDA code (C++, triton, CuPy) the target cannot run
DIFFERS = "runs differently"         # runs, on another path than on CUDA (a branch not taken)

CLASSES = (NEEDS_CHANGE, CANNOT_RUN, DIFFERS, HANDLED)      # the order of the report
BLOCKERS = (NEEDS_CHANGE, CANNOT_RUN)


@dataclasses.dataclass(frozen=True)
class Finding:
    path: str
    line: int
    column: int
    code: str                        # the source line, stripped
    kind: str                        # one of CLASSES
    what: str                        # what it is, and what it becomes on the target
    fix: Optional[str] = None        # the fix-it or the way out
    rule: str = ""                   # the rule's id (``catalog.RULES``)

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)
