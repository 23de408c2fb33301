"""apex.optimizers.fused_novograd: where programs import FusedNovoGrad from."""

from . import FusedNovoGrad  # noqa: F401
