"""One process: init_process_group("nccl") and collectives on "cuda" tensors, on gloo."""

import pytest
import torch
import torch.distributed as dist

from cudashim.patches.distributed import translate_backend


@pytest.fixture
def world_of_one(shim, tmp_path, request):
    yield f"file://{tmp_path}/store"
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.mark.parametrize("backend", ["nccl", dist.Backend.NCCL, "cuda:nccl", "cpu:gloo,cuda:nccl", None])
def test_init_process_group_nccl_becomes_gloo(world_of_one, backend):
    dist.init_process_group(backend, init_method=world_of_one, rank=0, world_size=1)
    # the program hears what it asked for; torch's own modules hear the real library
    assert dist.get_backend() == (str(backend) if backend is not None else "gloo")
    import types
    torch_internal = types.FunctionType(
        compile("def ask(d): return d.get_backend()", "<torch>", "exec").co_consts[0],
        {"__name__": "torch.distributed.distributed_c10d"})
    assert torch_internal(dist) == "gloo"
    objects = [None]
    dist.all_gather_object(objects, {"rank": 0})            # picks its device by the backend
    assert objects == [{"rank": 0}]
    t = torch.ones(3, device="cuda")
    dist.all_reduce(t)
    gathered = [torch.zeros(3, device="cuda")]
    dist.all_gather(gathered, t)
    dist.broadcast(t, src=0)
    dist.barrier(device_ids=[0])
    assert t.tolist() == gathered[0].tolist() == [1.0, 1.0, 1.0]
    group = dist.new_group(ranks=[0], backend="nccl")
    dist.all_reduce(t, group=group)
    assert dist.is_nccl_available()


def test_get_backend_can_be_answered_honestly(tmp_path):
    import cudashim
    cudashim.activate("cpu", honest="get_backend")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    assert dist.get_backend() == "gloo"
    dist.destroy_process_group()
    cudashim.deactivate()


def test_ddp_with_device_ids(world_of_one):
    dist.init_process_group("nccl", init_method=world_of_one, rank=0, world_size=1)
    torch.cuda.set_device(0)
    model = torch.nn.Linear(4, 2).to(0)
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], output_device=0)
    ddp(torch.randn(3, 4, device="cuda")).sum().backward()
    assert model.weight.grad is not None


def test_backend_strings_are_parsed_not_matched():
    class Xpu:
        device_type, collective = "xpu", "xccl"

        def process_group_backend(self):
            return "cpu:gloo,xpu:xccl"

    assert translate_backend("cpu:gloo,cuda:nccl", Xpu()) == "cpu:gloo,xpu:xccl"
    assert translate_backend("nccl", Xpu()) == "cpu:gloo,xpu:xccl"
    assert translate_backend("gloo", Xpu()) == "gloo"
    assert translate_backend("mpi", Xpu()) == "mpi"
