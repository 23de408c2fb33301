"""apex.optimizers.fused_lamb: where programs import FusedLAMB from."""

from . import FusedLAMB  # noqa: F401
