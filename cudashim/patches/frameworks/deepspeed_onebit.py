"""DeepSpeed's 1-bit optimizers (OnebitAdam, ZeroOneAdam, OnebitLamb) off CUDA.

Their ``comm_backend_name`` picks how the compressed allreduce packs sign bits:

- ``"nccl"`` (the default, and what programs written for GPUs say) imports
  ``deepspeed.runtime.comm.nccl``, which packs with CuPy on the tensors' memory. CuPy runs
  on CUDA only, so where the target is not CUDA that module is served as ``NcclBackend``
  below: the same call, computed by ``cudashim.kernels.CompressedBackend`` over
  ``torch.distributed`` (whatever collective library the target's ``nccl`` became).
- ``"compressed"`` uses DeepSpeed's own ``CompressedBackend``, which takes the accelerator's
  ``PackbitsBuilder`` op. Where the accelerator has none (DeepSpeed's CPU, MPS and HPU
  accelerators answer a builder that refuses to load), ``PackbitsBuilder`` below answers
  with ``cudashim.kernels``' sign packing.
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import sys

import torch
import torch.distributed as dist

from ...kernels import CompressedBackend, pack_signs, unpack_signs
from ...patching.import_hook import ImportHook

NCCL_MODULE = "deepspeed.runtime.comm.nccl"


def accelerator_class(name: str):
    """Where DeepSpeed keeps the accelerator ``DS_ACCELERATOR=name`` selects: its module and
    class name (``cpu`` -> ``deepspeed.accelerator.cpu_accelerator.CPU_Accelerator``)."""
    return f"deepspeed.accelerator.{name}_accelerator", f"{name.upper()}_Accelerator"


class NcclBackend:
    """DeepSpeed's ``NcclBackend``: the same constructor, attributes and
    ``compressed_allreduce`` signature, without CuPy."""

    def __init__(self, mpu=None):
        if mpu is None:
            self.world_group = dist.new_group(ranks=list(range(dist.get_world_size())))
        else:
            self.mpu = mpu
            self.world_group = mpu.get_data_parallel_group()
        self.rank = dist.get_rank(group=self.world_group)
        self.size = dist.get_world_size(group=self.world_group)
        self._backend = CompressedBackend(self.world_group)

    def compressed_allreduce(self, buffer_m: torch.Tensor, worker_error: torch.Tensor,
                             server_error: torch.Tensor, local_rank: int) -> torch.Tensor:
        """``buffer_m`` averaged over the group through 1-bit compression; the error
        tensors carry what compression lost to the next call. Returns the result in
        ``buffer_m``'s shape, as DeepSpeed's does (the optimizers keep what it returns)."""
        flat = buffer_m.reshape(-1)
        self._backend.compressed_allreduce(flat, worker_error, server_error)
        if not buffer_m.is_contiguous():
            buffer_m.copy_(flat.view(buffer_m.shape))    # reshape had to copy
        return buffer_m


class Packer:
    """What ``PackbitsBuilder().load()`` returns on DeepSpeed's GPU and XPU accelerators:
    ``packbits(floats, count, rank)`` packs the signs of the first ``count`` elements, a set
    bit where the element is >= 0, eight to a byte, the first in the high bit;
    ``unpackbits(packed, count, rank)`` turns ``count`` bytes back into 8 x ``count`` floats,
    +1.0 and -1.0."""

    @staticmethod
    def packbits(tensor: torch.Tensor, input_size: int, rank: int) -> torch.Tensor:
        return pack_signs(tensor.reshape(-1)[:input_size])

    @staticmethod
    def unpackbits(tensor: torch.Tensor, input_size: int, rank: int) -> torch.Tensor:
        return unpack_signs(tensor.reshape(-1)[:input_size])


class PackbitsBuilder:
    """DeepSpeed's op builder for the packbits op, with nothing to build."""

    NAME = "pack_bits"

    def __init__(self):
        self.name = self.NAME

    def absolute_name(self) -> str:
        return "cudashim.kernels"

    def is_compatible(self, verbose: bool = False) -> bool:
        return True

    def load(self, verbose: bool = True) -> Packer:
        return Packer()


def fill_in_packbits(wrapped, accelerator, args, kwargs):
    """A wrapt wrapper for an accelerator's ``get_op_builder(class_name)``: its own
    PackbitsBuilder where it has one (XPU), ours where it answers none or a builder that
    refuses to load."""
    builder = wrapped(*args, **kwargs)
    name = args[0] if args else kwargs.get("class_name")
    if name == "PackbitsBuilder" and (builder is None or builder.__name__ == "NotImplementedBuilder"):
        return PackbitsBuilder
    return builder


class NcclBackendFinder(ImportHook):
    """Serves ``deepspeed.runtime.comm.nccl`` as this module's ``NcclBackend`` while the
    activation is live: the real module imports CuPy at its top and cannot run here."""
    description = "the import hook for DeepSpeed's NCCL 1-bit backend"

    def spec_for(self, fullname):
        if fullname != NCCL_MODULE:
            return None
        return importlib.util.spec_from_loader(fullname, _NcclLoader())

    def forget(self) -> None:
        module = sys.modules.get(NCCL_MODULE)
        if module is not None and getattr(module, "NcclBackend", None) is NcclBackend:
            del sys.modules[NCCL_MODULE]          # a later import meets the real module again


class _NcclLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None

    def exec_module(self, module):
        module.__doc__ = ("DeepSpeed's NCCL backend for its 1-bit optimizers, served by cudashim: "
                          "the target cannot run CuPy, so cudashim.kernels packs the signs.")
        module.NcclBackend = NcclBackend
