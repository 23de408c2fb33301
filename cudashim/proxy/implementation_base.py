"""The base of cudashim's own implementations of ``torch.cuda`` modules (``implementation.py``).

Each subclass stands for one ``torch.cuda`` module and declares what it implements by what it
defines, as gevent's replacement modules do with ``__implements__``: every public attribute
of the class body (plus ``extra_names()``) is a name of that module.
"""

from __future__ import annotations

import functools
from typing import ClassVar, Dict, Tuple

from .forwarders import device_index


class Implementation:
    """The names of one ``torch.cuda`` module that cudashim implements itself."""
    module: ClassVar[str] = ""             # the module's name
    # Private names that programs and libraries call (copied from torch.cuda's own code):
    # implemented like public ones. Every other private name falls through to torch.
    private: ClassVar[Tuple[str, ...]] = ()

    def __init__(self, activation, real_module):
        self.backend = activation.backend
        self.settings = activation.settings
        self.real_module = real_module
        self.idx = functools.partial(device_index, self.backend)

    @classmethod
    @functools.lru_cache(maxsize=None)
    def implements(cls) -> Tuple[str, ...]:
        """This module's names that cudashim implements (its ``__implements__``); a class's
        body is fixed, so it is read once."""
        own = {name for klass in cls.__mro__[:cls.__mro__.index(Implementation)]
               for name in vars(klass) if not name.startswith("_")}
        return tuple(sorted((own - set(vars(Implementation))) | set(cls.extra_names())))

    @classmethod
    def extra_names(cls) -> Tuple[str, ...]:
        return ()

    def exports(self) -> Dict[str, object]:
        """name -> the object the proxy binds; subclasses add their ``extra_names()``."""
        extra = set(self.extra_names())
        return {name: getattr(self, name) for name in self.implements() + self.private
                if name not in extra}
