"""apex.optimizers.fused_adagrad: where programs import FusedAdagrad from."""

from . import FusedAdagrad  # noqa: F401
