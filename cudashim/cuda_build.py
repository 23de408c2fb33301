"""The CUDA build a program is told it runs on, and every version answer that follows from it.

A program that hears ``torch.version.cuda == "12.8"`` may also ask for cuDNN's version, the
architectures torch was built for, NCCL's version, the driver's version and the CUDA
version the driver supports (through NVML), and compare any two. The answers must describe
one machine that could exist, or a check such as ``cudnn.version() >= 8000`` or "the driver
is too old for this CUDA" fails on a machine cudashim made up. So they all come from one
row of ``BUILDS``, chosen by the ``cuda_version`` setting (``--cuda-version``,
``CUDASHIM_CUDA_VERSION``): the libraries torch's CUDA wheels of that line ship, and the
driver that CUDA release came with. A version between rows gets the row at or below it,
with its own number. The setting's default, ``auto``, is the running torch's own CUDA version
where torch is a CUDA build: the libraries built for that torch (torchvision, torchaudio) compare
theirs with it and refuse to import a major version apart. This module imports no torch.
"""

from __future__ import annotations

import sys
from typing import NamedTuple, Tuple

AUTO = "auto"
WITHOUT_A_CUDA_BUILD = "12.8"          # what ``auto`` is where torch is not a CUDA build

_SM_LEGACY = ("sm_50", "sm_60", "sm_70", "sm_75", "sm_80", "sm_86", "sm_90")


class CudaBuild(NamedTuple):
    cuda: str                      # torch.version.cuda
    cudnn: int                     # torch.backends.cudnn.version(): 9.10.2 is 91002
    nccl: Tuple[int, int, int]     # torch.cuda.nccl.version()
    driver: str                    # nvmlSystemGetDriverVersion(): the release's own driver
    arch_list: Tuple[str, ...]     # torch.cuda.get_arch_list()

    @property
    def driver_cuda_version(self) -> int:
        """nvmlSystemGetCudaDriverVersion(): 12.8 is 12080."""
        major, minor = (int(part) for part in self.cuda.split(".")[:2])
        return major * 1000 + minor * 10

    @property
    def nvml_version(self) -> str:
        """nvmlSystemGetNVMLVersion(): the CUDA major version, then the driver's."""
        return f"{self.cuda.split('.')[0]}.{self.driver}"

    def with_architecture(self, capability: Tuple[int, int]) -> Tuple[str, ...]:
        """The arch list, holding the device's own architecture (a program checks that
        ``sm_XY`` of ``get_device_capability()`` is in it, as torch warns when it is not)."""
        own = f"sm_{capability[0]}{capability[1]}"
        return self.arch_list if own in self.arch_list else tuple(sorted(self.arch_list + (own,)))


# (major, minor) of the first CUDA version each row serves -> the row (its cuda is replaced
# by the version asked for).
BUILDS = {
    (11, 0): CudaBuild("11.8", 8907, (2, 14, 3), "450.51.06", _SM_LEGACY[:-1]),
    (11, 8): CudaBuild("11.8", 90100, (2, 21, 5), "520.61.05", _SM_LEGACY),
    (12, 0): CudaBuild("12.1", 91002, (2, 21, 5), "525.60.13", _SM_LEGACY),
    (12, 4): CudaBuild("12.4", 91002, (2, 21, 5), "550.54.14", _SM_LEGACY),
    (12, 6): CudaBuild("12.6", 91002, (2, 24, 3), "560.28.03", _SM_LEGACY),
    (12, 8): CudaBuild("12.8", 91002, (2, 27, 5), "570.86.10", _SM_LEGACY + ("sm_100", "sm_120")),
    (12, 9): CudaBuild("12.9", 91002, (2, 27, 5), "575.51.03", _SM_LEGACY + ("sm_100", "sm_120")),
    (13, 0): CudaBuild("13.0", 91300, (2, 27, 7), "580.65.06",
                       ("sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_110", "sm_120")),
}


def heard_version(setting: str) -> str:
    """The ``torch.version.cuda`` the program hears under the ``cuda_version`` setting: the
    setting's, or for ``auto`` the running torch's own where it is a CUDA build (read behind
    cudashim's stand-in for ``torch.version``), else ``WITHOUT_A_CUDA_BUILD``."""
    if setting != AUTO:
        return setting
    module = sys.modules.get("torch.version")
    module = vars(module).get("_cudashim_real", module) if module is not None else None
    return getattr(module, "cuda", None) or WITHOUT_A_CUDA_BUILD


def cuda_build(cuda_version: str) -> CudaBuild:
    """The row for ``cuda_version`` ("12.8", "12.8.1", or ``auto``: ``heard_version``),
    answering to that version."""
    cuda_version = heard_version(cuda_version)
    wanted = tuple(int(part) for part in cuda_version.split(".")[:2])
    eligible = [start for start in BUILDS if start <= wanted] or [min(BUILDS)]
    return BUILDS[max(eligible)]._replace(cuda=cuda_version)
