"""The error-compensated 1-bit allreduce behind 1-bit Adam, 1-bit LAMB and 0/1 Adam.

Every rank sends one sign bit per element plus one scale, twice, instead of a float per
element: about 1/16 of a float32 all_reduce's traffic. What compression loses is kept in
the worker and server error tensors and added back on the next call, so the error does
not accumulate. Runs over ``torch.distributed`` on any collective library.
"""

from __future__ import annotations

import math
import types
from typing import Optional

import torch
import torch.distributed as dist

from . import native, pack_signs, unpack_signs


def _all_gather_single(output: torch.Tensor, given: torch.Tensor, group) -> None:
    """all_gather_into_tensor, under the name torch 2.13 gives it (the old one warns there)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(output, given, group=group)


def error_buffer_size(numel: int, world_size: int) -> int:
    """The worker-error length for a buffer of ``numel`` elements: rounded up to a multiple
    of 8 x world size, so the packed signs split into whole bytes, one chunk per rank.
    The server error is this divided by the world size."""
    unit = 8 * world_size
    return -(-numel // unit) * unit


def compensate_and_compress(buffer: torch.Tensor, error: torch.Tensor):
    """The worker side: ``buffer`` plus the error carried from the last call (``error`` is
    the longer, padded to whole bytes per rank; its padding carries its error alone),
    compressed. Works in ``error``, which ends holding what the compression missed."""
    flat = buffer.reshape(-1)
    if _on_host(flat, error):
        return native.compress_compensated(flat, error)
    error[:flat.numel()].add_(flat)
    return _compress_in_place(error)


def server_compress(received: torch.Tensor, scales: torch.Tensor, error: torch.Tensor):
    """The server side: this rank's chunk of every rank's signs (``received``, one row per
    rank), each row times its rank's scale, averaged, plus the error carried from the last
    call, compressed. Works in ``error`` as above."""
    rows = scales.numel()
    if _on_host(received, scales, error):
        return native.compress_server(received, scales, error)
    signs = unpack_signs(received, dtype=error.dtype).view(rows, -1).mul_(scales.view(rows, 1))
    error.add_(signs.sum(0).div_(rows))
    return _compress_in_place(error)


def expand_into(buffer: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor) -> None:
    """``buffer`` gets the decompressed result: row r of ``packed`` times ``scales[r]``, the
    rows end to end, as many elements as ``buffer`` holds."""
    if _on_host(buffer, packed, scales):
        native.expand_signs(packed, scales, buffer.view(-1))
        return
    rows = scales.numel()
    signs = unpack_signs(packed, dtype=scales.dtype).view(rows, -1).mul_(scales.view(rows, 1))
    buffer.copy_(signs.reshape(-1)[:buffer.numel()].view_as(buffer))


def _compress_in_place(x: torch.Tensor):
    """Scale and packed signs of ``x`` (zero counts as positive); ``x`` becomes what they
    fail to represent: ``x - scale * sign``."""
    scale = torch.linalg.vector_norm(x) / math.sqrt(x.numel())
    packed = pack_signs(x)
    x.sub_((x >= 0).to(x.dtype).mul_(2 * scale).sub_(scale))    # +scale or -scale
    return scale, packed


def _on_host(*tensors: torch.Tensor) -> bool:
    """Whether the compiled kernels take these: contiguous float32 (or uint8) CPU tensors."""
    return native.usable() and all(
        t.device.type == "cpu" and t.is_contiguous() and t.dtype in (torch.float32, torch.uint8)
        for t in tensors)


class CompressedBackend:
    """``compressed_allreduce`` over the ranks of ``group`` (default: the world)."""

    def __init__(self, group: Optional[dist.ProcessGroup] = None):
        self.group = group
        self.world_size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # Every tensor handed to the collective library is one of these buffers, kept for the
        # backend's life (one set per length of buffer, as a program's buckets repeat). Gloo's
        # worker threads drop a finished collective's tensors some time after the caller moved on;
        # where a worker drops the last reference to a tensor Python made, freeing it needs the
        # GIL, and torch 2.7 and earlier join those threads holding the GIL when the group is
        # destroyed, so destroy_process_group() could hang for good. Holding only the last
        # call's tensors narrowed that (a worker descheduled past a whole call still freed the
        # one before); tensors that live as long as the backend leave a worker nothing to free.
        self._buffers = {}

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
        kept = self._kept(size, packed, worker_scale)
        kept.packed.copy_(packed)
        dist.all_to_all_single(kept.received, kept.packed, group=self.group)
        worker_scales = self._all_gather_scale(worker_scale, kept.worker_scale, kept.worker_scales)

        # Server side: average this rank's chunk across ranks, compensate, compress again.
        server_scale, server_packed = server_compress(kept.received, worker_scales, server_error)

        # Everyone gathers every server chunk and decompresses the whole buffer.
        kept.server_packed.copy_(server_packed)
        _all_gather_single(kept.gathered, kept.server_packed, group=self.group)
        expand_into(buffer, kept.gathered,
                    self._all_gather_scale(server_scale, kept.server_scale, kept.server_scales))
        return buffer

    def _kept(self, size: int, packed: torch.Tensor, scale: torch.Tensor) -> types.SimpleNamespace:
        """The buffers this backend exchanges for a worker error of ``size`` elements."""
        kept = self._buffers.get((size, packed.device, scale.dtype))
        if kept is None:
            world = self.world_size
            server_bytes = size // world // 8

            def scales():
                return [torch.empty(1, dtype=scale.dtype, device=scale.device) for _ in range(world)]

            kept = types.SimpleNamespace(
                packed=torch.empty_like(packed), received=torch.empty_like(packed),
                server_packed=torch.empty(server_bytes, dtype=torch.uint8, device=packed.device),
                gathered=torch.empty(world * server_bytes, dtype=torch.uint8, device=packed.device),
                worker_scale=torch.empty(1, dtype=scale.dtype, device=scale.device),
                server_scale=torch.empty(1, dtype=scale.dtype, device=scale.device),
                worker_scales=scales(), server_scales=scales())
            self._buffers[(size, packed.device, scale.dtype)] = kept
        return kept

    def _all_gather_scale(self, scale: torch.Tensor, given: torch.Tensor, scales: list) -> torch.Tensor:
        given.copy_(scale.reshape(1))
        dist.all_gather(scales, given, group=self.group)
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
