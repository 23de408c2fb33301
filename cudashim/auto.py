"""``import cudashim.auto`` as a program's first line redirects CUDA for the whole program.

Settings come from the ``CUDASHIM_*`` environment variables.
"""

import torch  # noqa: F401  (imported now so a bad setting fails here, on this line)

from .activation import activate

activate()
