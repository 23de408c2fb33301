"""A stand-in for a vendor extension cudashim has never heard of (Moore Threads' torch_musa).

Like the real one it loads with torch through the ``torch.backends`` entry point, renames
PrivateUse1 to ``musa`` and registers its collective library, ``mccl``.
"""

import fake_accelerator


def _autoload():
    fake_accelerator.install("musa")
    fake_accelerator.register_collective("mccl")
