"""cudashim's test accelerator: a device with memory of its own, on any machine.

A PrivateUse1 backend (``device.cpp`` and ``kernels.cpp``) compiled here on first use and kept in torch's
extension folder. Its memory is pages the host cannot read or write outside the device's
own kernels, so on it a CUDA program's missed copy fails loudly where the CPU backend hides
it. It has ``N`` devices (default 2), a generator, streams, events and memory statistics per
device, pinned host memory, autocast for float16 and bfloat16, and a collective library of its
own name (``collectives.py``). Load it with ``python -m cudashim --test-devices N prog.py`` (or
``CUDASHIM_TEST_DEVICES=N``); cudashim then detects it as any vendor's accelerator.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import sys
from pathlib import Path

import torch

from ..errors import BackendUnavailableError

NAME = "shimdev"
DEFAULT_DEVICES = 2
HERE = Path(__file__).parent
SOURCES = ("device.h", "device.cpp", "kernels.cpp")
BUILD_NAME = "cudashim_testdevice"
CFLAGS = ("-O1",)
BUILT = "built"                  # written once a load in the build folder has succeeded

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
    """The compiled extension: built on first use, then loaded from its build folder."""
    global _compiled
    if _compiled is None:
        build = _build_folder()
        _compiled = _built_before(build) or _build(build)
    return _compiled


def _build(build: Path):
    missing = why_it_cannot_build()
    if missing:
        raise BackendUnavailableError(f"the test accelerator cannot be built: {missing}")
    from torch.utils import cpp_extension
    log.info("cudashim: building the test accelerator (cached after the first time)")
    sources = [str(copy) for copy in _sources_in(build) if copy.suffix == ".cpp"]
    extension = cpp_extension.load(name=BUILD_NAME, sources=sources, build_directory=str(build),
                                   extra_cflags=list(CFLAGS), verbose=False)
    (build / BUILT).write_text(f"{torch.__version__}\n")
    return extension


def _built_before(build: Path):
    """The extension a load in this folder built before, imported without torch's builder:
    importing that builder alone takes about 130 ms (setuptools), and its check that the
    build is current another 25 ms, in every process that uses the test accelerator. The
    folder's name already holds all a rebuild would follow."""
    library = build / f"{BUILD_NAME}.so"
    if not (build / BUILT).exists() or not library.exists():
        return None
    spec = importlib.util.spec_from_file_location(BUILD_NAME, library)
    extension = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(extension)
    return extension


def _build_folder() -> Path:
    """A folder for these sources built for this torch and this Python alone, named by their
    hash, under torch's extension folder (``TORCH_EXTENSIONS_DIR``, else the user's cache).
    Two versions of the sources (a checkout and an installed copy, two checkouts) that shared
    one folder raced: ninja, started after the other version's build had begun, found that
    build's objects newer than its own copy of the sources and loaded the other version."""
    key = hashlib.sha256(b"".join((HERE / name).read_bytes() for name in SOURCES))
    key.update(" ".join((torch.__version__, getattr(torch.version, "git_version", ""), sys.version,
                         *CFLAGS)).encode())
    root = os.environ.get("TORCH_EXTENSIONS_DIR") or \
        Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "torch_extensions"
    folder = Path(root) / BUILD_NAME / key.hexdigest()[:16]
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
