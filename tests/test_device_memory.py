"""torch.cuda's memory figures count what the program put on the device, as CUDA's allocator does.

On the CPU backend they count the storages moved or made there (``cudashim/device_memory.py``);
on a target whose allocator keeps some figures and not others (torchvulkan keeps no reserved
peak), the missing ones come from those it keeps. ``tests/programs/memory_accounting.py``
reads them as training code does, on every target.
"""

import json
import threading

import pytest

from conftest import python
from targets import targets


def _accounting(tmp_path, target=None):
    name = target.name if target else "cpu"
    out = tmp_path / f"{name}.json"
    result = python("-m", "cudashim", *(target.options if target else ()),
                    "tests/programs/memory_accounting.py", str(out), timeout=600)
    assert result.returncode == 0, f"{name}: {result.stderr[-4000:]}"
    assert "Memory used: " in result.stdout
    return json.loads(out.read_text())


def _failed(seen):
    return [f"{part}.{check}" for part, checks in seen.items() if part != "losses"
            for check, passed in checks.items() if not passed]


@pytest.mark.torch_range
def test_memory_figures_follow_allocations_offloads_and_steps_on_every_target(tmp_path):
    for target in (None, *targets()):
        seen = _accounting(tmp_path, target)
        assert not _failed(seen), (target.name if target else "cpu", _failed(seen))
        losses = seen["losses"]
        assert len(losses) == 5 and losses[-1] < losses[0]      # training went on after the reload


def test_a_tensor_counts_from_its_move_or_constructor_until_torch_frees_it(shim):
    import torch
    base = torch.cuda.memory_allocated()
    made = torch.zeros(1024, device="cuda")                      # a constructor's
    assert torch.cuda.memory_allocated() == base + made.nbytes
    assert made.cuda() is made and made.to("cuda") is made       # placed: a move returns it
    moved = torch.ones(256).cuda()                               # a move's copy
    assert torch.cuda.memory_allocated() == base + made.nbytes + moved.nbytes
    on_host = moved.cpu()                                        # host memory is not counted
    assert torch.cuda.memory_allocated() == base + made.nbytes + moved.nbytes
    halves = made.view(2, 512).unbind()                          # views count their storage once
    del made
    assert torch.cuda.memory_allocated() == base + 4096 + moved.nbytes
    del halves, moved
    assert torch.cuda.memory_allocated() == base and on_host.sum() == 256
    assert torch.cuda.max_memory_allocated() >= base + 4096 + 1024
    torch.cuda.reset_peak_memory_stats()
    assert torch.cuda.max_memory_allocated() == torch.cuda.memory_allocated() == base
    # a host constructor, a device read off a host tensor: not device memory
    torch.zeros(1024, device="cpu"), torch.zeros(1024, device=on_host.device)
    assert torch.cuda.memory_allocated() == base
    made_like = on_host.new_zeros(8, device="cuda"), torch.empty_like(on_host, device="cuda")
    assert torch.cuda.memory_allocated() == base + 32 + on_host.nbytes
    assert all(t.cuda() is t for t in made_like)


def test_a_module_and_its_optimizer_state_count_where_the_parameters_are(shim):
    import torch
    base = torch.cuda.memory_allocated()
    model = torch.nn.Linear(64, 64, device="cuda")               # built there
    size = sum(p.nbytes for p in model.parameters())
    assert torch.cuda.memory_allocated() == base + size
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(2, 64, device="cuda")).sum().backward()
    optimizer.step()                                             # gradients and momentum buffers
    assert torch.cuda.memory_allocated() == base + 3 * size
    optimizer.zero_grad(set_to_none=True)
    assert torch.cuda.memory_allocated() == base + 2 * size
    model.cpu()                                                  # the parameters leave the device
    assert torch.cuda.memory_allocated() == base + size          # the momentum stays
    host_model = torch.nn.Linear(64, 64)
    torch.optim.SGD(host_model.parameters(), lr=0.1, momentum=0.9).step()
    host_model(torch.randn(2, 64)).sum().backward()
    assert torch.cuda.memory_allocated() == base + size          # a host model's state is not counted


def test_the_figures_have_torch_cuda_keys_and_are_the_same_on_the_compiled_and_python_paths():
    import torch
    import cudashim
    figures = []
    for pure_python in (False, True):
        cudashim.activate("cpu", pure_python=pure_python)
        try:
            before = torch.cuda.memory_stats()
            kept = [torch.empty(n, device="cuda") for n in (10, 1000)]
            after = torch.cuda.memory_stats()
            figures.append({key: after[key] - before[key] for key in
                            ("allocated_bytes.all.current", "allocation.all.current",
                             "reserved_bytes.all.current", "active_bytes.all.peak")})
            assert after["num_alloc_retries"] == after["num_ooms"] == 0
            del kept
            assert torch.cuda.memory_stats()["allocated_bytes.all.freed"] - before["allocated_bytes.all.freed"] == 4040
        finally:
            cudashim.deactivate()
    assert figures[0] == figures[1] == {"allocated_bytes.all.current": 4040, "allocation.all.current": 2,
                                        "reserved_bytes.all.current": 4040, "active_bytes.all.peak": 4040}


def _both_twins():
    from cudashim import device_memory, speedups
    twins = [pytest.param(device_memory.DeviceMemory, id="python")]
    if speedups.built():
        twins.append(pytest.param(speedups._compiled.DeviceMemory, id="compiled"))
    return twins


@pytest.mark.parametrize("twin", _both_twins())
def test_storages_freed_in_other_threads_are_counted_off(twin):
    import torch
    memory = twin()
    tensors = [torch.empty(100) for _ in range(400)]
    for tensor in tensors:
        memory.add(tensor)
        memory.add(tensor[1:])                                    # the same storage: once
    assert memory.allocated == 400 * 400 and memory.allocations == 400

    def free(part):
        for index in part:
            tensors[index] = None
    threads = [threading.Thread(target=free, args=(range(start, 400, 4),)) for start in range(4)]
    for thread in threads:
        thread.start()
    for tensor in range(100):
        memory.add(torch.empty(25))                               # counted while others free
    for thread in threads:
        thread.join()
    assert memory.allocated == 0 and memory.allocations == 0 and memory.peak >= 400 * 400
    assert memory.free_count == memory.allocation_count == 500


@pytest.mark.parametrize("twin", _both_twins())
def test_what_has_no_storage_of_its_own_is_not_counted(twin):
    import torch
    memory = twin()
    sparse = torch.eye(3).to_sparse()
    for thing in (sparse, None, 3, torch.empty(0)):
        memory.add(thing)
    assert not memory.holds(sparse) and not memory.holds(None)
    assert memory.allocated == 0 and memory.allocations == 1          # the empty tensor's storage
    with pytest.raises(TypeError):
        twin(1)
