"""apex.optimizers.fused_sgd: where programs import FusedSGD from."""

from . import FusedSGD  # noqa: F401
