"""``torch.version.cuda``, ``torch.backends.cuda.is_built()`` and cuDNN's version answer by who asks.

Libraries gate features on them: the Hugging Face Trainer refuses ``--tf32`` (and, in places,
bf16) when ``torch.version.cuda`` is None, and programs compare
``torch.backends.cudnn.version() >= 8000``, which raises on the None a build without cuDNN
gives. The program and its libraries hear a CUDA build (the ``cuda_version`` setting; by
default the running torch's own CUDA version where it is a CUDA build) with the cuDNN that
torch's wheels for that CUDA line ship (``cuda_build``, the one table of
version answers); torch and the libraries that load native CUDA code hear the truth
(``callers``).
"""

import sys
import types

import torch

from ..cuda_build import cuda_build, heard_version
from ..patching.by_caller import ByCaller, value_by_caller


def _cudnn_version(activation, original):
    version = cuda_build(activation.settings.cuda_version).cudnn
    return lambda: version


BY_CALLER = (
    ByCaller("torch.backends.cuda:is_built", lambda activation, original: lambda: True,
             became="True (a CUDA build)"),
    ByCaller("torch.backends.cudnn:version", _cudnn_version, became=repr),
    ByCaller("torch.backends.cudnn:is_available", lambda activation, original: lambda: True,
             became="True"),
)


def install(activation):
    version = _version_module(activation, torch.version)
    activation.registry.set_item(sys.modules, "torch.version", version)
    activation.registry.set_attr(torch, "version", version)


def _version_module(activation, real):
    """A stand-in for ``torch.version``: ``cuda`` answers by who asks; every other name is
    the real module's."""
    cuda_version = heard_version(activation.settings.cuda_version)
    cuda = value_by_caller(activation, "torch.version.cuda", lambda: real.cuda, cuda_version,
                           became=repr(cuda_version))

    class VersionModule(types.ModuleType):
        @property
        def cuda(self):
            return cuda()

        def __getattr__(self, name):
            return getattr(real, name)

        def __dir__(self):
            return dir(real)

    module = VersionModule(real.__name__, real.__doc__)
    module.__dict__["_cudashim_real"] = real      # what cuda_build.heard_version reads behind it
    for dunder in ("__file__", "__package__", "__spec__", "__loader__"):
        if hasattr(real, dunder):
            module.__dict__[dunder] = getattr(real, dunder)
    return module
