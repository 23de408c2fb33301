"""The error-compensated 1-bit allreduce behind 1-bit Adam, 1-bit LAMB and 0/1 Adam.

Every rank sends one sign bit per element plus one scale, twice, instead of a float per
element: about 1/16 of a float32 all_reduce's traffic. What compression loses is kept in
the worker and server error tensors and added back on the next call, so the error does
not accumulate. Runs over ``torch.distributed`` on any collective library.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.distributed as dist

from . import native, pack_signs, unpack_signs


def error_buffer_size(numel: int, world_size: int) -> int:
    """The worker-error length for a buffer of ``numel`` elements: rounded up to a multiple
    of 8 x world size, so the packed signs split into whole bytes, one chunk per rank.
    The server error is this divided by the world size."""
    unit = 8 * world_size
    return -(-numel // unit) * unit


def _compress(x: torch.Tensor, error: torch.Tensor):
    """Scale and packed signs of ``x`` (zero counts as positive); ``error`` becomes what
    they fail to represent: ``x - scale * sign``."""
    if _on_host(x, error):
        return native.compress(x, error)
    scale = torch.linalg.vector_norm(x) / math.sqrt(x.numel())
    scaled_signs = (x >= 0).to(x.dtype).mul_(2 * scale).sub_(scale)    # +scale or -scale
    torch.sub(x, scaled_signs, out=error)
    return scale, pack_signs(x)


def compensate_and_compress(buffer: torch.Tensor, error: torch.Tensor):
    """The worker side: ``buffer`` plus the error carried from the last call (``error`` is
    the longer, padded to whole bytes per rank), compressed; ``error`` is updated."""
    n, size = buffer.numel(), error.numel()
    x = native.empty(size, error.dtype) if _on_host(error) else torch.empty_like(error)
    torch.add(error[:n], buffer.reshape(-1), out=x[:n])
    x[n:] = error[n:]                                  # the padding carries its error alone
    return _compress(x, error)


def _on_host(*tensors: torch.Tensor) -> bool:
    """Whether the compiled kernels take these: contiguous float32 (or uint8) CPU tensors."""
    return native.usable() and all(
        t.device.type == "cpu" and t.is_contiguous() and t.dtype in (torch.float32, torch.uint8)
        for t in tensors)


def _signs_times_scales(packed: torch.Tensor, scales: torch.Tensor, rows: int, columns: int,
                        summed: bool) -> torch.Tensor:
    """Row r of the packed signs times ``scales[r]``: rows x columns, or summed over rows."""
    if _on_host(packed, scales):
        out = native.empty(columns if summed else rows * columns, torch.float32)
        native.signs_into(packed, scales, out, rows, accumulate=summed)
        return out if summed else out.view(rows, columns)
    signs = unpack_signs(packed, dtype=scales.dtype).view(rows, columns)
    signs.mul_(scales.view(rows, 1))
    return signs.sum(0) if summed else signs


class CompressedBackend:
    """``compressed_allreduce`` over the ranks of ``group`` (default: the world)."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)

    def compressed_allreduce(self, buffer: torch.Tensor, worker_error: torch.Tensor,
                             server_error: torch.Tensor) -> torch.Tensor:
        """Average ``buffer`` across ranks through 1-bit compression, in place; returns it.

        ``worker_error`` has ``error_buffer_size(buffer.numel(), world_size)`` elements and
        ``server_error`` that divided by the world size; both start at zero and are
        carried from call to call.
        """
        world, size, n = self.world_size, worker_error.numel(), buffer.numel()
        if size % (8 * world) or size < n:
            raise ValueError(f"worker_error has {size} elements; expected "
                             f"error_buffer_size({n}, {world}) = {error_buffer_size(n, world)}")
        chunk = size // world
        if server_error.numel() != chunk:
            raise ValueError(f"server_error has {server_error.numel()} elements; expected {chunk}")

        # Worker side: compensate, compress, send chunk r of the signs to rank r.
        worker_scale, packed = compensate_and_compress(buffer, worker_error)
        received = torch.empty_like(packed)
        dist.all_to_all_single(received, packed, group=self.group)
        worker_scales = self._all_gather_scale(worker_scale)

        # Server side: average this rank's chunk across ranks, compensate, compress again.
        server = _signs_times_scales(received, worker_scales, world, chunk, summed=True).div_(world)
        server.add_(server_error)
        server_scale, server_packed = _compress(server, server_error)

        # Everyone gathers every server chunk and decompresses the whole buffer.
        gathered = [torch.empty_like(server_packed) for _ in range(world)]
        dist.all_gather(gathered, server_packed, group=self.group)
        server_scales = self._all_gather_scale(server_scale)
        result = _signs_times_scales(torch.cat(gathered), server_scales, world, chunk, summed=False)
        buffer.copy_(result.reshape(-1)[:n].view_as(buffer))
        return buffer

    def _all_gather_scale(self, scale: torch.Tensor) -> torch.Tensor:
        scales = [torch.empty(1, dtype=scale.dtype, device=scale.device) for _ in range(self.world_size)]
        dist.all_gather(scales, scale.reshape(1), group=self.group)
        return torch.cat(scales)

    @staticmethod
    def wire_bytes(numel: int, world_size: int, dtype_bytes: int = 4) -> int:
        """Bytes one rank sends per call (payloads only): its signs to the other ranks,
        its server chunk's signs, and two scales to each."""
        size = error_buffer_size(numel, world_size)
        others = world_size - 1
        signs_out = size // 8 * others // world_size          # all_to_all: all chunks but its own
        server_out = size // world_size // 8 * others          # all_gather of its server chunk
        return signs_out + server_out + 2 * dtype_bytes * others
