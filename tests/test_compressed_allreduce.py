"""The 1-bit compressed allreduce on 2 and 4 gloo ranks against a one-process reference
written from the algorithm's description."""

import math

import pytest
import torch
import torch.multiprocessing as mp

import _compressed_worker
from cudashim.kernels import CompressedBackend, error_buffer_size


def sign(x):
    return torch.where(x >= 0, 1.0, -1.0)


def reference(inputs_per_step, world, numel):
    """Every rank's results and final error tensors, computed in one process."""
    size = error_buffer_size(numel, world)
    chunk = size // world
    worker_errors = [torch.zeros(size) for _ in range(world)]
    server_errors = [torch.zeros(chunk) for _ in range(world)]
    outputs = []
    for inputs in inputs_per_step:
        compressed = []
        for r in range(world):
            x = torch.zeros(size)
            x[:numel] = inputs[r]
            x += worker_errors[r]
            scale = x.norm() / math.sqrt(size)
            worker_errors[r] = x - scale * sign(x)
            compressed.append(scale * sign(x))
        server = []
        for r in range(world):
            mine = sum(compressed[s][r * chunk:(r + 1) * chunk] for s in range(world)) / world
            mine = mine + server_errors[r]
            scale = mine.norm() / math.sqrt(chunk)
            server_errors[r] = mine - scale * sign(mine)
            server.append(scale * sign(mine))
        outputs.append(torch.cat(server)[:numel])
    return outputs, worker_errors, server_errors


@pytest.mark.torch_range       # and its ranks end at destroy_process_group, where torch 2.7 could hang
@pytest.mark.parametrize("world, numels", [(2, (1000,)), (4, (999, 64))])
def test_matches_the_reference_across_steps(tmp_path, world, numels):
    steps = 4
    mp.spawn(_compressed_worker.run, args=(world, f"file://{tmp_path}/store", numels, steps,
                                           str(tmp_path)), nprocs=world, join=True)
    for numel in numels:
        inputs = [[_compressed_worker.rank_inputs(r, s, numel) for r in range(world)] for s in range(steps)]
        expected, worker_errors, server_errors = reference(inputs, world, numel)
        for r in range(world):
            got = torch.load(tmp_path / f"rank{r}-{numel}.pt")
            for step in range(steps):
                torch.testing.assert_close(got["results"][step], expected[step], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got["worker_error"], worker_errors[r], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(got["server_error"], server_errors[r], rtol=1e-5, atol=1e-6)
        # error feedback is doing something: the first step's residue is not zero
        assert worker_errors[0].abs().sum() > 0


def test_buffer_size_helper_and_validation():
    assert error_buffer_size(10, 2) == 16 and error_buffer_size(16, 2) == 16
    assert error_buffer_size(17, 4) == 32 and error_buffer_size(0, 3) == 0
    assert CompressedBackend.wire_bytes(16 * 2**20, 2) < 16 * 2**20 * 4 / 15
