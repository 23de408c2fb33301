"""cudashim's stand-in for NVIDIA apex, on torch.optim, torch.nn and torch.amp.

Served under the name ``apex`` (with ``amp_C``) where the real package cannot work on the
target (see ``cudashim/substitutes/finder.py``): ``apex.optimizers``, ``apex.normalization``,
``apex.amp``, ``apex.parallel`` and ``apex.multi_tensor_apply``. ``apex.contrib`` and fused
kernels without a torch equivalent raise an ImportError naming the way out.
"""

from cudashim.substitutes import LIBRARIES

__version__ = LIBRARIES["apex"].full_version

# The real package imports these at its own import, and code reaches them as attributes of a
# bare ``import apex``: DeepSpeed's fp16 optimizer checks ``apex.optimizers.FusedAdam``.
from . import amp, normalization, optimizers, parallel  # noqa: E402,F401
