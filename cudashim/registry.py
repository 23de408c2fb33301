"""One registry of patches: apply records the original, revert restores it.

A patch knows its owner (a module, a class, or a mapping such as ``sys.modules``), the
name it replaces and the replacement. Applying records what was there; reverting puts that
exact object back (or deletes the name if the owner did not have it in its own ``__dict__``,
as for a method inherited from a C base class), and only if what is there is still ours.
State that is not an attribute (a hook torch calls) is recorded as an undo function.

Tables that know objects by identity (TorchScript's builtins) follow replacements through
``watch``: a watcher hears of every attribute replaced after it was added.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, Callable, List, Optional

import wrapt

log = logging.getLogger(__name__)

_ABSENT = object()


@dataclasses.dataclass(eq=False)           # a patch is one event: identity, not value
class Patch:
    owner: Any
    name: str
    replacement: Any
    is_item: bool = False          # owner[name] instead of owner.name
    original: Any = _ABSENT        # what the owner resolved to before
    owned: bool = True             # the name sat in the owner's own __dict__ (or mapping)
    undo: Optional[Callable[[], Any]] = None     # for state that is not an attribute

    def describe(self) -> str:
        if self.undo is not None:
            return self.name
        owner = getattr(self.owner, "__name__", type(self.owner).__name__)
        return f"{owner}[{self.name!r}]" if self.is_item else f"{owner}.{self.name}"


class PatchRegistry:
    """Applies patches in order and reverts them in the reverse order."""

    def __init__(self):
        self._applied: List[Patch] = []
        self._watchers: List[Callable[[Any, Any], None]] = []
        self._lock = threading.RLock()

    def __len__(self):
        return len(self._applied)

    def __iter__(self):
        return iter(list(self._applied))

    def set_attr(self, owner, name: str, replacement):
        """Replace ``owner.name``; return the original it resolved to."""
        _, _, original = wrapt.resolve_path(owner, name)   # reads class __dict__ along the MRO
        owned = name in vars(owner) if hasattr(owner, "__dict__") else True
        patch = Patch(owner, name, replacement, original=original, owned=owned)
        with self._lock:
            setattr(owner, name, replacement)
            self._applied.append(patch)
            for watcher in self._watchers:
                watcher(original, replacement)
        return original

    def add_attr(self, owner, name: str, value) -> None:
        """Give ``owner`` a name it lacks; reverting deletes it again."""
        if name in vars(owner):
            raise ValueError(f"{owner!r} already has {name!r}: use set_attr to replace it")
        with self._lock:
            setattr(owner, name, value)
            self._applied.append(Patch(owner, name, value, owned=False))

    def watch(self, watcher: Callable[[Any, Any], None]) -> None:
        """Call ``watcher(original, replacement)`` for every attribute replaced from now on."""
        with self._lock:
            self._watchers.append(watcher)

    def add_undo(self, description: str, undo: Callable[[], Any]) -> None:
        """Record state changed outside any attribute; ``undo()`` restores it on revert."""
        with self._lock:
            self._applied.append(Patch(None, description, None, undo=undo))

    def set_item(self, mapping, key: str, replacement):
        """Replace ``mapping[key]`` (``sys.modules``, ``os.environ``); return the original."""
        original = mapping.get(key, _ABSENT)
        patch = Patch(mapping, key, replacement, is_item=True, original=original,
                      owned=original is not _ABSENT)
        with self._lock:
            mapping[key] = replacement
            self._applied.append(patch)
        return None if original is _ABSENT else original

    def original(self, owner, name: str):
        """The object ``owner.name`` had before cudashim; the first original wins."""
        for patch in self._applied:
            if patch.owner is owner and patch.name == name:
                return patch.original
        return getattr(owner, name)

    def revert_to(self, count: int) -> None:
        """Undo the patches made after the first ``count``, newest first (a group that could
        not finish takes back what it had done)."""
        with self._lock:
            while len(self._applied) > count:
                _revert(self._applied.pop())

    def revert_all(self) -> List[str]:
        """Undo every patch, newest first; return the ones someone else had replaced since."""
        skipped = []
        with self._lock:
            self._watchers.clear()
            while self._applied:
                patch = self._applied.pop()
                if not _revert(patch):
                    skipped.append(patch.describe())
        for what in skipped:
            log.warning("cudashim left %s alone: it was replaced after cudashim patched it", what)
        return skipped


def _revert(patch: Patch) -> bool:
    if patch.undo is not None:
        return patch.undo() is not False
    if patch.is_item:
        current = patch.owner.get(patch.name, _ABSENT)
        # os.environ decodes a new str on every read: strings are compared by value.
        if current is not patch.replacement and not (isinstance(current, str) and current == patch.replacement):
            return False
        if patch.owned:
            patch.owner[patch.name] = patch.original
        else:
            del patch.owner[patch.name]
        return True
    current = vars(patch.owner).get(patch.name, _ABSENT) if hasattr(patch.owner, "__dict__") \
        else getattr(patch.owner, patch.name, _ABSENT)
    if current is not patch.replacement:
        return False
    if patch.owned:
        setattr(patch.owner, patch.name, patch.original)
    else:
        delattr(patch.owner, patch.name)
    return True
