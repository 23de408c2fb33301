"""``import cudashim.auto`` as a program's first line redirects CUDA for the whole program.

Settings come from the ``CUDASHIM_*`` environment variables. As under ``python -m
cudashim``, every Python the program starts (``subprocess``, torchrun ranks, spawned
workers) comes up shimmed with the same settings: they are exported to the environment,
with the start-up hook's folder on ``PYTHONPATH``.
"""

import torch  # noqa: F401  (imported now so a bad setting fails here, on this line)

from . import _settings, launcher
from .activation import activate

_chosen = _settings.load()
activate(settings=_chosen)
launcher.export_to_children(_chosen)
