"""``torch.version.cuda``, ``torch.backends.cuda.is_built()`` and cuDNN's version answer by who asks.

Libraries gate features on them: the Hugging Face Trainer refuses ``--tf32`` (and, in places,
bf16) when ``torch.version.cuda`` is None, and programs compare
``torch.backends.cudnn.version() >= 8000``, which raises on the None a build without cuDNN
gives. The program and its libraries hear a CUDA build (the ``cuda_version`` setting) with
the cuDNN that torch's wheels for that CUDA line ship (``cuda_build``, the one table of
version answers); torch and the libraries that load native CUDA code hear the truth
(``callers``).
"""

import functools
import sys
import types

import torch

from ..callers import asking_module, hears_truth
from ..cuda_build import cuda_build


def install(activation):
    real_version = torch.version
    version = _version_module(real_version, activation.settings.cuda_version, activation.report)
    activation.registry.set_item(sys.modules, "torch.version", version)
    activation.registry.set_attr(torch, "version", version)

    report = activation.report

    def make_is_built(original):
        def is_built():
            honest = hears_truth()
            if report is not None:
                report.heard("torch.backends.cuda.is_built", asking_module(), honest)
                if not honest:
                    report.count("torch.backends.cuda.is_built", "True (a CUDA build)")
            return original() if honest else True
        is_built.__doc__ = original.__doc__
        return is_built

    activation.replace(torch.backends.cuda, "is_built", make_is_built)
    cudnn = cuda_build(activation.settings.cuda_version).cudnn
    for question, compatible in (("version", cudnn), ("is_available", True)):
        activation.replace(torch.backends.cudnn, question, functools.partial(
            _by_who_asks, f"torch.backends.cudnn.{question}", compatible, report))


def _by_who_asks(api, compatible, report, original):
    """``original``'s answer for torch and the honest modules, ``compatible`` for the rest."""
    @functools.wraps(original)
    def answer(*args, **kwargs):
        honest = hears_truth()
        if report is not None:
            report.heard(api, asking_module(), honest)
            if not honest:
                report.count(api, repr(compatible))
        return original(*args, **kwargs) if honest else compatible
    return answer


def _version_module(real, cuda_version, report):
    """A stand-in for ``torch.version``: ``cuda`` answers by who asks; every other name is
    the real module's."""

    class VersionModule(types.ModuleType):
        @property
        def cuda(self):
            honest = hears_truth()
            if report is not None:
                report.heard("torch.version.cuda", asking_module(), honest)
                if not honest:
                    report.count("torch.version.cuda", repr(cuda_version))
            return real.cuda if honest else cuda_version

        def __getattr__(self, name):
            return getattr(real, name)

        def __dir__(self):
            return dir(real)

    module = VersionModule(real.__name__, real.__doc__)
    for dunder in ("__file__", "__package__", "__spec__", "__loader__"):
        if hasattr(real, dunder):
            module.__dict__[dunder] = getattr(real, dunder)
    return module
