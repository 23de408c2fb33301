"""apex.optimizers.fused_adam: where programs import FusedAdam from."""

from . import FusedAdam  # noqa: F401
