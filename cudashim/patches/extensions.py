"""CUDA C++ extensions: building one is refused with the way out, not with torch's CUDA_HOME error.

``CUDAExtension`` (in a setup.py), and ``torch.utils.cpp_extension.load``/``load_inline``
given CUDA sources or ``with_cuda=True``, compile with nvcc for NVIDIA GPUs; no target runs
what they build. ``cuda_sources()`` decides from a call's arguments, and ``cudashim scan``
asks it too, so a program hears before it runs what it will hear when it builds.
``torch.utils.cpp_extension`` imports setuptools, so the patch waits for the program to
import it.
"""

from __future__ import annotations

import functools
import inspect
from typing import List, Mapping, Optional


from ..errors import UnsupportedCudaAPI
from ..patching.when_imported import WhenImported

MODULE = "torch.utils.cpp_extension"
BUILDERS = ("CUDAExtension", "load", "load_inline")
CUDA_SUFFIXES = (".cu", ".cuh")


def cuda_sources(builder: str, arguments: Mapping[str, object]) -> Optional[List[str]]:
    """What a call of ``builder`` with these named arguments compiles for CUDA; None when
    nothing. Values that are not known (``cudashim scan`` reading a variable) are
    ``Ellipsis``: they name no file and ask for nothing."""
    if builder == "CUDAExtension":
        return _names(arguments.get("sources")) or ["its sources"]
    if builder == "load":
        found = [name for name in _names(arguments.get("sources")) if name.endswith(CUDA_SUFFIXES)]
    else:
        given = arguments.get("cuda_sources")
        found = ["inline CUDA sources"] if given not in (None, "", [], ()) else []
    if not found and arguments.get("with_cuda") is True:
        found = ["with_cuda=True"]
    return found or None


def _names(sources) -> List[str]:
    if isinstance(sources, str):
        return [sources]
    if isinstance(sources, (list, tuple)):
        return [source for source in sources if isinstance(source, str)]
    return []


def way_out(backend) -> str:
    build = "SyclExtension" if backend.device_type == "xpu" else "CppExtension"
    return (f"nvcc builds it for NVIDIA GPUs only; build the extension for the target instead "
            f"({build} with its C++ sources), use a package that ships a {backend.device_type} "
            f"build, or write the op with torch operations")


def _refuse_cuda_builds(activation, module):
    for builder in BUILDERS:
        activation.replace(module, builder, functools.partial(_refusing, builder, activation.backend))


WHEN_IMPORTED = (WhenImported(MODULE, _refuse_cuda_builds),)


def _refusing(builder, backend, original):
    signature = inspect.signature(original)

    @functools.wraps(original)
    def build(*args, **kwargs):
        try:
            arguments = signature.bind(*args, **kwargs).arguments
        except TypeError:
            return original(*args, **kwargs)           # torch's own message for a bad call
        sources = cuda_sources(builder, arguments)
        if sources is not None:
            raise UnsupportedCudaAPI(f"{MODULE}.{builder}", backend.name,
                                     f"it compiles CUDA ({', '.join(sources)}); {way_out(backend)}")
        return original(*args, **kwargs)

    return build
