"""apex.optimizers: torch.optim where one matches exactly, LAMB and NovoGrad written here."""

from cudashim.substitutes._refuse import refusing_getattr

from ._torch_backed import FusedAdagrad, FusedAdam, FusedSGD
from ._written import FusedLAMB, FusedNovoGrad

__all__ = ["FusedAdam", "FusedSGD", "FusedAdagrad", "FusedLAMB", "FusedNovoGrad"]
__getattr__ = refusing_getattr(__name__, {
    "FusedMixedPrecisionLamb": "use FusedLAMB under torch.autocast",
})
