"""cudashim: run unmodified CUDA-only PyTorch programs on whatever accelerator is present.

    import cudashim
    cudashim.activate()            # or: python -m cudashim train.py / import cudashim.auto

Importing cudashim imports no torch; activation does (or waits for it).
"""

from .activation import activate, activated, current_backend, deactivate, get_original, is_active
from .errors import CudashimWarning, UnsupportedCudaAPI

__version__ = "0.1.0"

__all__ = ["activate", "activated", "current_backend", "deactivate", "get_original", "is_active",
           "CudashimWarning", "UnsupportedCudaAPI", "__version__"]
