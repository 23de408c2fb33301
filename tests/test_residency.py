"""Moves between host and device copy where device memory is host memory, as they do on CUDA.

On the CPU backend torch's own move between "cuda" and the host is an alias. The program
``tests/programs/copy_semantics.py`` relies on the copy as real programs do (a best-weights
snapshot, a host EMA, a checkpoint written while training goes on, a pinned staging buffer, an
array edited after ``.cpu().numpy()``, activations offloaded by saved-tensor hooks); it runs on
the CPU backend and on the targets whose copies are real, which must agree.
"""

import json

import pytest

from conftest import python
from targets import targets


def _copy_semantics(tmp_path, target=None):
    name = target.name if target else "cpu"
    out = tmp_path / f"{name}.json"
    result = python("-m", "cudashim", *(target.options if target else ()), "tests/programs/copy_semantics.py",
                    str(out), timeout=600)
    assert result.returncode == 0, f"{name}: {result.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.mark.torch_range
def test_programs_that_rely_on_copies_see_them_on_every_target(tmp_path):
    cpu = _copy_semantics(tmp_path)
    assert cpu["checks"] and all(cpu["checks"].values()), [k for k, v in cpu["checks"].items() if not v]
    assert cpu["pinned"] is True           # pin_memory() returns pinned memory, as CUDA's does
    for target in targets():
        seen = _copy_semantics(tmp_path, target)
        assert seen["checks"] == cpu["checks"], target.name
        # (whether pin_memory() pins for the target depends on the torch: before 2.5 it pins for
        # CUDA only, so the target's own pinning is the device-semantics test's concern)
        # the same first loss; after that Adam (lr 0.05) amplifies the order in which the target's
        # kernels and the host's accumulate, which differs by CPU (llvmpipe's on AVX-512: 6e-4)
        assert seen["losses"][0] == pytest.approx(cpu["losses"][0], rel=1e-5), target.name
        assert seen["losses"] == pytest.approx(cpu["losses"], rel=5e-3), target.name


def _storage_shared(a, b) -> bool:
    """Whether two tensors' storages are one memory."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def test_a_move_to_where_a_tensor_is_returns_it(shim):
    import torch
    on_device = torch.ones(3).cuda()
    assert on_device.cuda() is on_device and on_device.to("cuda") is on_device
    assert on_device.to(torch.device("cuda:0")) is on_device and on_device.to(0) is on_device
    on_host = on_device.cpu()
    assert on_host is not on_device
    assert on_host.cpu() is on_host and on_host.to("cpu") is on_host
    assert on_host.to(torch.device("cpu")) is on_host
    # a device read off a tensor names the side the tensor is on
    assert on_device.to(on_device.device) is on_device and on_host.to(on_host.device) is on_host
    assert on_host.to(on_device.device) is not on_host and on_device.to(on_host.device) is not on_device
    unplaced = torch.ones(2) * 2            # an op's result: its side is not known
    assert unplaced.to(unplaced.device) is unplaced and unplaced.to(on_host.device) is not unplaced
    # a conversion is torch's own new tensor, placed where it went
    half = on_host.to("cuda", torch.float16)
    assert half.dtype == torch.float16 and half.cuda() is half


def test_moves_copy_in_both_directions_and_lazily(shim):
    import torch
    host = torch.arange(6.0)
    device = host.cuda()
    assert torch.equal(device, host)
    device.add_(1)
    assert host.tolist() == [0, 1, 2, 3, 4, 5] and device.tolist() == [1, 2, 3, 4, 5, 6]
    back = device.to("cpu", non_blocking=True)
    assert back is not device and torch.equal(back, device)
    device.mul_(0)
    assert back.tolist() == [1, 2, 3, 4, 5, 6]
    # a copy is memory of its own from the start, as CUDA's: a thread reading one side while the
    # program writes the other (a collective's worker, a checkpoint writer) shares nothing
    copied = torch.arange(4.0).to(torch.device("cuda"))
    assert not _storage_shared(copied, copied.cpu())
    # autograd flows through a copy, as through CUDA's
    leaf = torch.ones(2, requires_grad=True)
    (leaf.cuda() * 3).sum().backward()
    assert leaf.grad.tolist() == [3.0, 3.0]


def test_memory_torch_does_not_own_is_copied_at_once(shim):
    """A write through the array after the move does not reach the device."""
    import numpy as np
    import torch
    array = np.ones(3, dtype=np.float32)
    device = torch.from_numpy(array).cuda()
    array[0] = 5
    assert device.tolist() == [1, 1, 1]


def test_modules_move_in_place_and_keep_what_they_share(shim):
    """A module's own tensors of unknown side stay where they are on a move: its parameters keep
    their memory, views into a flattened buffer stay views, a buffer the program holds stays it.
    After the move each is known to be on the device, so ``.cpu()`` of its state copies."""
    import torch
    model = torch.nn.Linear(4, 2)
    held_buffer = torch.zeros(2)
    model.register_buffer("running", held_buffer)
    weight_memory = model.weight.data_ptr()
    model.cuda()
    assert model.weight.data_ptr() == weight_memory and model.running is held_buffer
    model.to("cuda")
    assert model.running is held_buffer
    state = {k: v.cpu() for k, v in model.state_dict().items()}
    with torch.no_grad():
        model.weight.add_(1)
    assert not torch.equal(state["weight"], model.weight)
    # and back: the host copy of a module on the device is a copy
    model.cpu()
    assert model.running is not held_buffer
    held_buffer.add_(7)
    assert model.running.tolist() == [0, 0]



def test_a_module_moving_in_one_thread_leaves_another_threads_moves_copies(shim):
    """A module's move keeps its own tensors in that thread only: a data loader's or a
    checkpoint writer's thread moving a tensor meanwhile gets its copy."""
    import threading

    import torch

    class Held(torch.nn.Linear):
        def _apply(self, fn, *args, **kwargs):      # torch calls it within the module's move
            moving.set()
            assert released.wait(60), "the other thread never moved its tensor"
            return super()._apply(fn, *args, **kwargs)

    moving, released = threading.Event(), threading.Event()
    model = Held(4, 2)
    weight_memory = model.weight.data_ptr()
    mover = threading.Thread(target=model.cuda)
    mover.start()
    try:
        assert moving.wait(60)
        batch = torch.ones(3)
        on_device = batch.cuda()
    finally:
        released.set()
        mover.join()
    assert on_device is not batch and on_device.data_ptr() != batch.data_ptr()
    assert model.weight.data_ptr() == weight_memory       # the module's own stayed
def test_pinning_returns_a_pinned_copy(shim):
    import torch
    host = torch.ones(3)
    pinned = host.pin_memory()
    assert pinned is not host and pinned.is_pinned() and not host.is_pinned()
    assert pinned.pin_memory() is pinned and pinned.cpu() is pinned
    staged = pinned.cuda(non_blocking=True)
    pinned.fill_(2)
    assert staged.tolist() == [1, 1, 1]


def test_a_data_loader_hands_out_pinned_copies_of_its_samples(shim):
    import warnings

    import torch
    from torch.utils.data import DataLoader
    samples = [torch.full((2,), float(i)) for i in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")        # no "no accelerator is found": CUDA pins here
        loader = DataLoader(samples, batch_size=None, pin_memory=True)
        assert loader.pin_memory
        for sample, batch in zip(samples, loader):
            assert batch.is_pinned() and not sample.is_pinned()
            batch.mul_(0)                      # the program's own copy to edit, as on CUDA
        assert [sample.tolist() for sample in samples] == [[0, 0], [1, 1], [2, 2], [3, 3]]
        batches = list(DataLoader(samples, batch_size=2, pin_memory=True, num_workers=1))
    assert [batch.is_pinned() for batch in batches] == [True, True]
    assert [batch.tolist() for batch in batches] == [[[0, 0], [1, 1]], [[2, 2], [3, 3]]]
    assert not any(batch.is_pinned() for batch in DataLoader(samples, batch_size=2))


def test_the_report_counts_the_copies_it_made(tmp_path):
    program = tmp_path / "moves.py"
    program.write_text("import torch\nx = torch.ones(3)\nfor _ in range(3):\n    y = x.cuda()\n    z = y.cpu()\n"
                       "y.cuda()\n")
    result = python("-m", "cudashim", "--report", str(program))
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stderr.splitlines() if "a copy to the" in line]
    # three copies each way; the last .cuda() of a tensor already on the device is no copy
    assert ["Tensor.cuda,", "a", "copy", "3"] in [line[:4] for line in lines], result.stderr
    assert ["Tensor.cpu,", "a", "copy", "3"] in [line[:4] for line in lines], result.stderr


def test_a_device_read_off_a_tensor_is_a_host_device_either_way(shim):
    """Only the moves tell the target's device object from the program's torch.device("cpu"):
    values, hashes, pickles, type checks and dict keys are torch's."""
    import pickle
    import torch
    on_device = torch.ones(2).cuda()
    on_host = on_device.cpu()
    read = on_device.device
    assert read is torch.device("cuda") and on_host.device is torch.device("cpu")
    assert read == torch.device("cpu") and read.type == "cpu" and read.index is None
    assert isinstance(read, torch.device) and {read: 1}[torch.device("cpu")] == 1
    assert pickle.loads(pickle.dumps(read)) == read
    assert torch.device(read) is read         # torch.device(x.device) names the same side
    assert on_host.to(torch.device(read)) is not on_host
    with pytest.raises(AttributeError, match="not writable"):
        on_device.device = torch.device("cpu")
    # a module moved off the host keeps its parameter objects: they answer where they are now
    module = torch.nn.Linear(2, 2).cuda()
    module.to("meta")
    assert module.weight.device.type == "meta"


def test_a_report_run_copies_as_a_plain_run(tmp_path):
    """The report counts every torch.device() call, so its devices are made afresh each time:
    the program's torch.device("cpu") is still one object, a move to it a copy."""
    program = tmp_path / "moves.py"
    program.write_text("import torch\ny = torch.ones(3, device='cuda')\nh = y.to(torch.device('cpu'))\n"
                       "h.add_(1)\nz = torch.ones(3).to(y.device)\nz.add_(1)\n"
                       "print(y.tolist(), torch.device('cpu') is torch.device('cpu'))\n")
    for flags in ((), ("--report",)):
        result = python("-m", "cudashim", *flags, str(program))
        assert result.returncode == 0, result.stderr
        assert result.stdout.split() == ["[1.0,", "1.0,", "1.0]", "True"], (flags, result.stdout)


def test_deactivation_restores_torch_own_moves():
    result = python("-c", "import torch, torch.utils._device, cudashim\n"
                    "before = (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda, torch.as_tensor, torch.asarray,"
                    " torch.Tensor.numpy, torch.Tensor.type, vars(torch.UntypedStorage).get('to'),"
                    " vars(torch.UntypedStorage).get('cpu'), torch.optim.Optimizer.load_state_dict,"
                    " torch.nn.Module.to, torch.nn.Module.cuda, torch.nn.Module.cpu, torch.Tensor.pin_memory,"
                    " vars(torch.Tensor).get('device'), torch.utils._device.DeviceContext.__torch_function__,"
                    " torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__)\n"
                    "cudashim.activate('cpu')\nx = torch.ones(2).cuda()\nx.numpy(force=True)\nx.untyped_storage().cpu()\n"
                    "cudashim.deactivate()\n"
                    "after = (torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.cuda, torch.as_tensor, torch.asarray,"
                    " torch.Tensor.numpy, torch.Tensor.type, vars(torch.UntypedStorage).get('to'),"
                    " vars(torch.UntypedStorage).get('cpu'), torch.optim.Optimizer.load_state_dict,"
                    " torch.nn.Module.to, torch.nn.Module.cuda, torch.nn.Module.cpu, torch.Tensor.pin_memory,"
                    " vars(torch.Tensor).get('device'), torch.utils._device.DeviceContext.__torch_function__,"
                    " torch.Tensor.__deepcopy__, torch.nn.Parameter.__deepcopy__)\n"
                    "assert before == after, (before, after)\nassert x.cpu() is x\nprint('restored')")
    assert result.returncode == 0 and "restored" in result.stdout, result.stderr


@pytest.mark.torch_range
def test_an_offloaded_kv_cache_generates_what_the_resident_one_does_on_every_target(tmp_path):
    """transformers' offloaded cache moves each layer's keys and values to the host and
    prefetches them back on a ``torch.Stream()`` that waits for ``torch.cuda``'s stream."""
    pytest.importorskip("transformers")
    runs = {}
    for target in (None, *targets()):
        name = target.name if target else "cpu"
        out = tmp_path / f"{name}.json"
        result = python("-m", "cudashim", *(target.options if target else ()),
                        "tests/programs/offloaded_cache.py", str(out), timeout=600)
        assert result.returncode == 0, f"{name}: {result.stderr[-4000:]}"
        runs[name] = json.loads(out.read_text())
        assert runs[name]["offloaded"] == runs[name]["default"], name
        assert runs[name]["on_device"] == (target.name if target else "cpu")
        assert len(runs[name]["default"][0]) == 10


def test_device_generic_streams_and_events_are_the_targets_where_it_has_none(shim):
    """torch.Stream() and torch.Event() name the current accelerator, CUDA's for the program:
    on the CPU backend they are its host streams and events, which torch.cuda's are too."""
    import torch
    side = torch.Stream()
    assert isinstance(side, torch.Stream) and isinstance(torch.cuda.default_stream(), torch.Stream)
    side.wait_stream(torch.cuda.default_stream())            # torch's own CPU stream refuses
    with side:
        assert torch.cuda.current_stream() is side
        moved = torch.ones(4).to("cuda", non_blocking=True)
    assert torch.cuda.current_stream() is not side
    start, end = torch.Event(enable_timing=True), torch.Event(device="cuda", enable_timing=True)
    start.record(side)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) >= 0 and isinstance(start, torch.Event)
    assert side.query() and moved.sum() == 4
    host_stream = torch.Stream(device="cpu")                  # the host's, by name: torch's own
    assert host_stream.__class__ is shim.get_original(torch, "Stream")
