"""A rank of the compressed-allreduce test (imported by spawned processes)."""

import torch
import torch.distributed as dist


def rank_inputs(rank: int, step: int, numel: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(numel, generator=generator)


def run(rank, world_size, init_method, numels, steps, out_dir):
    """Each length of ``numels`` in turn, in one group: one start of the ranks serves them all."""
    from cudashim.kernels import CompressedBackend, error_buffer_size
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world_size)
    backend = CompressedBackend()
    for numel in numels:
        size = error_buffer_size(numel, world_size)
        worker_error, server_error = torch.zeros(size), torch.zeros(size // world_size)
        results = []
        for step in range(steps):
            buffer = rank_inputs(rank, step, numel)
            backend.compressed_allreduce(buffer, worker_error, server_error)
            results.append(buffer.clone())
        torch.save({"results": results, "worker_error": worker_error, "server_error": server_error},
                   f"{out_dir}/rank{rank}-{numel}.pt")
    dist.destroy_process_group()
