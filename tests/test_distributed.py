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


def _import_after_init():
    """torch.distributed.nn.functional as torch._dynamo imports it (DDP's constructor imports
    torch._dynamo) once a group exists: its defaults take ``group.WORLD`` at import."""
    import importlib
    import torch.distributed.nn.functional as functional
    return importlib.reload(functional)


def test_a_destroyed_nccl_group_ends_at_destroy_not_with_torch_defaults(world_of_one):
    import weakref
    dist.init_process_group("nccl", init_method=world_of_one, rank=0, world_size=1)
    functional = _import_after_init()
    assert functional.all_reduce.__defaults__[-1] is dist.group.WORLD      # what torch captured
    group = weakref.ref(dist.group.WORLD)
    dist.destroy_process_group()
    assert functional.all_reduce.__defaults__[-1] is None     # None: the default group, whatever it is
    assert group() is None                                    # ended here, as NCCL's would


def test_deactivation_gives_torch_defaults_back_their_group_while_it_exists(tmp_path):
    import cudashim
    cudashim.activate("cpu")
    dist.init_process_group("nccl", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    functional = _import_after_init()
    group = dist.group.WORLD                  # the program still holds it
    dist.destroy_process_group()
    assert functional.broadcast.__defaults__ == (None,)
    cudashim.deactivate()
    assert functional.broadcast.__defaults__[0] is group


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



def test_groups_a_program_leaves_are_destroyed_before_the_interpreter_finalises(tmp_path):
    import json
    from conftest import python
    program = ("import sys; sys.path.insert(0, 'tests/programs'); import exit_probe\n"
               f"exit_probe.report_at_exit({str(tmp_path / 'exit.json')!r})\n"
               "import torch, torch.distributed as dist\n"
               f"dist.init_process_group('nccl', init_method='file://{tmp_path}/store', rank=0, world_size=1)\n"
               "dist.all_reduce(torch.ones(2, device='cuda'), group=dist.new_group([0], backend='nccl'))\n")
    result = python("-m", "cudashim", "-c", program)
    assert result.returncode == 0, result.stderr[-2000:]
    assert json.loads((tmp_path / "exit.json").read_text()) == {"initialized": False, "threads": []}


def test_collectives_take_the_shapes_nccl_takes(world_of_one):
    """NCCL checks element counts only; programs gather a 0-d scale into 1-element tensors
    (DeepSpeed's 1-bit backends) or into a stacked output. Gloo wants equal shapes."""
    dist.init_process_group("nccl", init_method=world_of_one, rank=0, world_size=1)
    gathered = [torch.zeros(1, device="cuda")]
    dist.all_gather(gathered, torch.tensor(3.0, device="cuda"))
    assert gathered[0].tolist() == [3.0]
    into = [torch.zeros(1, 1)]
    dist.gather(torch.tensor([4.0]), gather_list=into, dst=0)
    assert into[0].tolist() == [[4.0]]
    received = torch.zeros(1)
    dist.scatter(received, [torch.tensor(5.0)], src=0)
    assert received.tolist() == [5.0]
    stacked = torch.zeros(1, 2)
    dist.all_gather_into_tensor(stacked, torch.tensor([6.0, 7.0]))
    assert stacked.tolist() == [[6.0, 7.0]]
    flat = torch.zeros(1, 2)                # SyncBatchNorm gathers columns into one row
    dist.all_gather_into_tensor(flat, torch.tensor([[8.0], [9.0]]))
    assert flat.tolist() == [[8.0, 9.0]]
    scale = torch.zeros(1)
    dist.all_gather_into_tensor(scale, torch.tensor(10.0))
    assert scale.tolist() == [10.0]
    with pytest.raises(RuntimeError, match="invalid tensor size"):    # counts still must agree
        dist.all_gather([torch.zeros(2)], torch.tensor(3.0))


def test_fsdp_without_a_device_id_takes_cudas_device(world_of_one):
    # pytorch/examples' 2-D parallel example: FSDP over a device mesh, the module moved to
    # "cuda" and no device_id; torch would refuse a module whose parameters are on the host.
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    dist.init_process_group("nccl", init_method=world_of_one, rank=0, world_size=1)
    mesh = init_device_mesh("cuda", (1,))
    torch.manual_seed(0)
    model = FSDP(torch.nn.Linear(4, 2).to("cuda"), device_mesh=mesh, use_orig_params=True)
    reference = torch.nn.Linear(4, 2)
    reference.load_state_dict({k: v.clone() for k, v in model.state_dict().items()})
    x = torch.randn(3, 4, device="cuda")
    model(x).sum().backward()
    reference(x).sum().backward()
    grads = {name.rpartition(".")[2]: p.grad for name, p in model.named_parameters()}
    assert torch.equal(grads["weight"], reference.weight.grad)
    dist.destroy_process_group()


def test_a_worker_of_an_elastic_round_keys_its_store_by_the_round(monkeypatch):
    """A restarted group across nodes must not read its dead predecessor's keys from the
    agent's store: a worker told its rendezvous round keeps its keys under that round."""
    import cudashim
    from cudashim.patches.distributed.elastic_rounds import ROUND
    from conftest import free_port
    import datetime
    port, timeout = free_port(), datetime.timedelta(seconds=20)
    server = dist.TCPStore("127.0.0.1", port, is_master=True, wait_for_workers=False, timeout=timeout)
    server.set("default_pg/0//cpu/rank_0", "a dead rank's address")
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "True")
    monkeypatch.setenv(ROUND, "3")
    import importlib
    rendezvous = importlib.import_module("torch.distributed.rendezvous")    # dist.rendezvous is a function
    original = rendezvous._create_c10d_store
    cudashim.activate("cpu")
    try:
        store = rendezvous._create_c10d_store("127.0.0.1", port, 0, 2, timeout)
        assert store.check(["default_pg/0//cpu/rank_0"]) is False       # the round's own keys only
        store.set("default_pg/0//cpu/rank_0", "this round's address")
        assert server.get("cudashim/rendezvous-round-3/default_pg/0//cpu/rank_0") == b"this round's address"
        monkeypatch.delenv(ROUND)                                       # an agent cudashim never saw
        assert rendezvous._create_c10d_store("127.0.0.1", port, 0, 2, timeout
                                             ).get("default_pg/0//cpu/rank_0") == b"a dead rank's address"
    finally:
        cudashim.deactivate()
    assert rendezvous._create_c10d_store is original
