"""cudashim's test accelerator: a device with memory of its own, on any machine.

A PrivateUse1 backend (``device.cpp`` and ``kernels.cpp``) compiled here on first use and cached by torch's
extension builder. Its memory is pages the host cannot read or write outside the device's
own kernels, so on it a CUDA program's missed copy fails loudly where the CPU backend hides
it. It has ``N`` devices (default 2), a generator, streams, events and memory statistics per
device, pinned host memory, autocast for float16 and bfloat16, and a collective library of its
own name (``collectives.py``). Load it with ``python -m cudashim --test-devices N prog.py`` (or
``CUDASHIM_TEST_DEVICES=N``); cudashim then detects it as any vendor's accelerator.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from pathlib import Path

import torch

from ..errors import BackendUnavailableError

NAME = "shimdev"
DEFAULT_DEVICES = 2
HERE = Path(__file__).parent
SOURCES = ("device.h", "device.cpp", "kernels.cpp")
BUILD_NAME = "cudashim_testdevice"

log = logging.getLogger(__name__)
_compiled = None


def why_it_cannot_build():
    """None where the test accelerator can be compiled here, else what is missing."""
    from torch.utils import cpp_extension
    compiler = os.environ.get("CXX", "c++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler ('{compiler}' is not on PATH; install g++ or set CXX)"
    if not cpp_extension.is_ninja_available():
        return "ninja is not installed (pip install ninja)"
    if not (Path(torch.__file__).parent / "include" / "torch" / "extension.h").exists():
        return "this torch has no C++ headers"
    return None


def compiled():
    """The compiled extension: built on first use, then loaded from torch's extension cache."""
    global _compiled
    if _compiled is None:
        missing = why_it_cannot_build()
        if missing:
            raise BackendUnavailableError(f"the test accelerator cannot be built: {missing}")
        from torch.utils import cpp_extension
        log.info("cudashim: building the test accelerator (cached after the first time)")
        build = _build_folder(Path(cpp_extension._get_build_directory(BUILD_NAME, verbose=False)))
        sources = [str(copy) for copy in _sources_in(build) if copy.suffix == ".cpp"]
        _compiled = cpp_extension.load(name=BUILD_NAME, sources=sources, build_directory=str(build),
                                       extra_cflags=["-O1"], verbose=False)
    return _compiled


def _build_folder(extensions: Path) -> Path:
    """A folder of torch's extension cache for these sources alone, named by their hash. Two
    versions of the sources (a checkout and an installed copy, two checkouts) that shared one
    folder raced: ninja, started after the other version's build had begun, found that build's
    objects newer than its own copy of the sources and loaded the other version."""
    digest = hashlib.sha256(b"".join((HERE / name).read_bytes() for name in SOURCES)).hexdigest()[:16]
    folder = extensions / digest
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _sources_in(build: Path):
    """The sources, each copied into the build folder where it differs: the build command
    names its sources, so a checkout and an installed copy of cudashim would otherwise rebuild
    in turn."""
    copies = []
    for name in SOURCES:
        copy, text = build / name, (HERE / name).read_bytes()
        if not copy.exists() or copy.read_bytes() != text:
            partial = build / f".{name}.{os.getpid()}"
            partial.write_bytes(text)
            os.replace(partial, copy)                # atomic: a build beside this one reads all or none
        copies.append(copy)
    return copies


def load(devices: int = DEFAULT_DEVICES) -> None:
    """Make ``devices`` test devices and register them with torch as ``shimdev``; again with
    the same count is a no-op."""
    name = torch._C._get_privateuse1_backend_name()
    if name not in ("privateuseone", NAME):
        raise BackendUnavailableError(
            f"the test accelerator cannot load: this process already renamed torch's PrivateUse1 "
            f"device to '{name}' (one out-of-tree device per process)")
    compiled().init(int(devices))
    if name == NAME:
        return
    from . import collectives, module
    torch.utils.rename_privateuse1_backend(NAME)
    torch._register_device_module(NAME, module)
    torch.utils.generate_methods_for_privateuse1_backend(for_storage=True)
    collectives.register()
