"""Programs that dispatch on a device's type reach the target's device module: it answers
every torch.cuda name, on every backend, and gives the names back on deactivation."""

import pytest
import torch

from conftest import install_fake

from cudashim import backends
from cudashim._settings import load
from cudashim.tables import cuda_surface

BACKENDS = [name for name in backends.names() if name != "cuda"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_target_device_module_answers_every_torch_cuda_name(backend):
    install_fake(backend)
    import cudashim
    cuda_names = cuda_surface.public_names(torch.cuda)
    cls, _ = backends.resolve(backend)              # imports the vendor: its module exists
    module = getattr(torch, cls(load()).device_type)
    had = dict(vars(module))
    cudashim.activate(backend)
    try:
        assert getattr(torch, torch.device("cuda").type) is module
        assert [name for name in cuda_names if not hasattr(module, name)] == []
        assert torch.get_device_module(torch.device("cuda", 0)) is module

        # What a PEFT example or accelerate asks of the module it dispatched to.
        assert isinstance(module.is_bf16_supported(), bool)
        module.manual_seed_all(0)
        module.empty_cache()
        assert isinstance(module.memory_allocated(), int)
        assert isinstance(module.max_memory_allocated(0), int)
        assert module.get_device_properties(0).total_memory > 0
        assert module.device_count() >= 1
        state = module.get_rng_state()
        module.set_rng_state(state)
    finally:
        cudashim.deactivate()
    left = dict(vars(module))
    assert {name: left.get(name) for name in had} == had   # nothing the module had was replaced
    assert [name for name in cuda_names if name in left and name not in had] == []


def test_only_missing_names_are_added_and_they_answer_for_the_target(shim):
    # torch.cpu has its own synchronize and device_count: they stay torch's.
    real_cpu = shim.get_original(torch.cpu, "synchronize")
    assert torch.cpu.synchronize is real_cpu
    assert torch.cpu.device_count is shim.get_original(torch.cpu, "device_count")
    # An added name answers for the target whoever asks, torch included: torch's fork_rng
    # asks the device module for the RNG state of the program's devices.
    torch.manual_seed(1)
    with torch.random.fork_rng(devices=[0], device_type="cpu"):
        torch.randn(3)
    after_fork = torch.randn(3)
    torch.manual_seed(1)
    assert torch.equal(after_fork, torch.randn(3))
    assert torch.cpu.current_device() == "cpu"              # torch's own answer, kept
    assert torch.cpu.mem_get_info()[1] > 0


def test_the_additions_leave_with_deactivation():
    import cudashim
    assert not hasattr(torch.cpu, "is_bf16_supported")
    cudashim.activate("cpu")
    assert torch.cpu.is_bf16_supported() in (True, False)
    cudashim.deactivate()
    assert not hasattr(torch.cpu, "is_bf16_supported")
    assert not hasattr(torch.cpu, "memory_allocated")


def test_the_cpus_stand_in_stream_records_events_as_cudas_does():
    """FSDP2 takes its streams from the mesh's device module, so a CUDA program's HSDP on the CPU
    target records its events on ``torch.cpu.Stream``, which answers None where CUDA's stream
    returns the event (torch 2.7 asserts it got one)."""
    import cudashim
    torchs_own = torch.cpu.Stream.record_event
    cudashim.activate("cpu")
    try:
        stream = torch.cpu.Stream()
        event = stream.record_event()
        assert isinstance(event, torch.cpu.Event) and event.query()
        given = torch.cpu.Event()
        assert stream.record_event(given) is given
        torch.cpu.current_stream().wait_event(event)         # what FSDP does with it: met at once
        event.synchronize()
    finally:
        cudashim.deactivate()
    assert torch.cpu.Stream.record_event is torchs_own
