import sys
import time

import pytest
import torch

from conftest import python


def test_proxy_is_installed_everywhere_torch_cuda_is_reached(shim):
    proxy = sys.modules["torch.cuda"]
    assert torch.cuda is proxy and proxy is not shim.get_original(torch, "cuda")
    import torch.cuda.amp as amp
    from torch.cuda.amp import GradScaler, autocast
    assert amp is sys.modules["torch.cuda.amp"] is torch.cuda.amp
    assert GradScaler is torch.cuda.amp.GradScaler and autocast is torch.cuda.amp.autocast
    for sub in ("nvtx", "random", "memory", "streams", "graphs", "amp"):
        assert sys.modules[f"torch.cuda.{sub}"] is getattr(torch.cuda, sub)
    assert torch.cuda.memory.memory_allocated is torch.cuda.memory_allocated
    assert torch.cuda._is_compiled is shim.get_original(torch, "cuda")._is_compiled


def test_what_starting_real_cuda_sets_on_torch_cuda_reaches_the_real_module():
    """On a machine with CUDA and another target, torch's own code may start CUDA, which sets
    names on sys.modules["torch.cuda"] (the proxy): the real module's functions must find
    ``_get_device_properties`` in their globals, and the proxy keeps its own answers."""
    import types

    from cudashim.patches.cuda_module import _starting_cuda_for

    real, proxy = types.ModuleType("torch.cuda"), types.ModuleType("torch.cuda")
    proxy.default_generators = ("the target's",)

    def start():                        # what torch._C._cuda_init does to sys.modules["torch.cuda"]
        proxy._get_device_properties = len
        proxy.default_generators = ("CUDA's",)
        return "started"

    assert _starting_cuda_for(real, proxy, start)() == "started"
    assert real._get_device_properties is len and real.default_generators == ("CUDA's",)
    assert proxy.default_generators == ("the target's",) and "_get_device_properties" not in vars(proxy)


@pytest.mark.skipif(not hasattr(torch._C, "_cuda_init"), reason="this torch is built without CUDA")
def test_starting_real_cuda_goes_through_cudashim_while_active_and_not_after():
    import cudashim
    original = torch._C._cuda_init
    cudashim.activate("cpu")
    assert torch._C._cuda_init is not original
    cudashim.deactivate()
    assert torch._C._cuda_init is original


def test_rng_calls_drive_the_cpu_generator(shim):
    torch.cuda.manual_seed(7)
    a = torch.rand(4, device="cuda")
    torch.manual_seed(7)
    assert torch.equal(a, torch.rand(4))
    state = torch.cuda.get_rng_state()
    b = torch.randn(3)
    torch.cuda.set_rng_state(state)
    assert torch.equal(b, torch.randn(3))
    torch.cuda.manual_seed_all(11)
    assert torch.cuda.initial_seed() == 11
    assert len(torch.cuda.get_rng_state_all()) == torch.cuda.device_count()


def test_rng_trackers_setting_states_through_lazy_call_take_effect(shim):
    """Megatron's and DeepSpeed's trackers (copied from torch.cuda.random) set a state in a
    call back handed to ``torch.cuda._lazy_call``; torch holds it until CUDA initializes,
    which it never does under the shim."""
    from torch.cuda import _lazy_call, _lazy_init
    _lazy_init()                                   # the target is ready: nothing to refuse
    torch.cuda.manual_seed(5)
    saved = torch.cuda.get_rng_state()
    expected = torch.rand(3, device="cuda")
    torch.cuda.manual_seed(9)

    def set_state():
        torch.cuda.default_generators[torch.cuda.current_device()].set_state(saved)

    _lazy_call(set_state)
    assert torch.equal(torch.rand(3, device="cuda"), expected)
    real = shim.get_original(torch, "cuda")
    assert torch.cuda._lazy_call is not real._lazy_call and torch.cuda._sleep is real._sleep


def test_torch_cudas_device_index_parser_takes_the_programs_devices(shim):
    parse = torch.cuda._get_device_index
    assert parse("cuda:0") == parse(0) == parse(torch.device("cuda", 0)) == parse(torch.cuda.device(0)) == 0
    assert parse(None, optional=True) == parse("cuda", optional=True) == torch.cuda.current_device()
    assert parse("cpu", allow_cpu=True) == -1
    for bad in (None, "cuda", "mps:0"):
        with pytest.raises(ValueError):
            parse(bad)


def test_event_timing_is_measured(shim):
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    time.sleep(0.05)
    end.record()
    end.synchronize()
    assert 45 <= start.elapsed_time(end) < 5000
    with pytest.raises(RuntimeError, match="recorded"):
        torch.cuda.Event(enable_timing=True).elapsed_time(end)
    with pytest.raises(RuntimeError, match="enable_timing"):
        torch.cuda.Event().elapsed_time(end)


def test_memory_statistics_are_real(shim):
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.max_memory_allocated()
    block = torch.ones(64 * 2 ** 20 // 4, device="cuda")          # 64 MiB on the device
    peak = torch.cuda.max_memory_allocated()
    assert peak - base == 64 * 2 ** 20
    assert torch.cuda.memory_allocated() - base == 64 * 2 ** 20
    host = torch.ones(64 * 2 ** 20 // 4)                          # host memory: not the device's
    assert torch.cuda.memory_allocated() - base == 64 * 2 ** 20 and host[0] == 1
    del block
    assert torch.cuda.memory_allocated() == base and torch.cuda.max_memory_allocated() == peak
    free, total = torch.cuda.mem_get_info()
    assert 0 < free <= total == torch.cuda.get_device_properties(0).total_memory
    stats = torch.cuda.memory_stats()
    assert stats["allocated_bytes.all.peak"] == peak and stats["allocated_bytes.all.current"] == base
    assert torch.cuda.memory_stats_as_nested_dict()["allocated_bytes"]["all"]["peak"] > 0
    assert "allocated" in torch.cuda.memory_summary()


def test_device_properties_and_feature_checks(shim):
    p = torch.cuda.get_device_properties(0)
    assert p.name == torch.cuda.get_device_name(0) and p.total_memory > 2 ** 30
    assert (p.major, p.minor) == torch.cuda.get_device_capability() == (8, 0)
    assert p.multi_processor_count >= 1
    assert torch.cuda.is_bf16_supported() and torch.cuda.is_available()
    assert "sm_80" in torch.cuda.get_arch_list()        # the CUDA 12.8 wheels' list holds it
    assert torch.cuda.current_device() == 0 and torch.cuda.device_count() == 1


def test_is_available_tells_torch_the_truth(shim):
    import types
    asked_by_torch = types.FunctionType(
        compile("def ask(cuda): return cuda.is_available()", "<torch>", "exec").co_consts[0],
        {"__name__": "torch._dynamo.utils"})
    assert torch.cuda.is_available() is True
    # the truth: False here, True on a machine with CUDA, where a target was named
    assert asked_by_torch(torch.cuda) is vars(torch.cuda)["_cudashim_real"].is_available()
    if not hasattr(torch._C, "_cuda_getDeviceCount"):
        assert asked_by_torch(torch.cuda) is False


def test_refused_api_names_itself_the_backend_and_the_way_out(shim):
    for refuse in (lambda: torch.cuda.MemPool(), lambda: torch.cuda.use_mem_pool(None),
                   lambda: torch.cuda.nccl.all_reduce([]), lambda: torch.cuda.cudart(),
                   lambda: torch.cuda.utilization()):
        with pytest.raises(shim.UnsupportedCudaAPI) as info:
            refuse()
        message = str(info.value)
        assert message.startswith("torch.cuda.") and "'cpu' backend" in message
        assert "\n" not in message
    assert isinstance(shim.UnsupportedCudaAPI("a", "b", "c"), RuntimeError)
    assert not isinstance(object(), torch.cuda.MemPool)


def test_harmless_apis_do_nothing_and_warn_once_by_default():
    import warnings
    import cudashim
    cudashim.activate("cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.profiler.start()
        with torch.cuda.profiler.profile():
            torch.cuda.profiler.start()
        torch.cuda.tunable.enable(True)
        enabled = torch.cuda.tunable.is_enabled()
        results = torch.cuda.tunable.get_results()
        torch.cuda.nvtx.range_push("step")             # a profiler range: nothing to warn of
        torch.cuda.nvtx.range_pop()
    ours = [str(w.message) for w in caught if issubclass(w.category, cudashim.CudashimWarning)]
    assert len(ours) == 5, ours            # start, profile, enable, is_enabled, get_results once
    assert all("does nothing on the 'cpu' backend" in message for message in ours)
    assert enabled is False and results == ()
    with pytest.raises(cudashim.UnsupportedCudaAPI):
        torch.cuda.MemPool()                   # not harmless: still refused
    cudashim.deactivate()


def test_emit_nvtx_does_nothing_on_the_cpu_and_warns_once(shim):
    import warnings
    model = torch.nn.Linear(2, 2).cuda()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):                     # Megatron's --profile: every step in emit_nvtx
            with torch.autograd.profiler.emit_nvtx(record_shapes=True):
                model(torch.ones(1, 2, device="cuda")).sum().backward()
    ours = [w for w in caught if issubclass(w.category, shim.CudashimWarning)]
    assert len(ours) == 1 and "emit_nvtx records nothing on the 'cpu' backend" in str(ours[0].message)
    assert model.weight.grad is not None


def test_harmless_apis_raise_under_the_strict_setting():
    import cudashim
    cudashim.activate("cpu", unsupported="raise")
    with pytest.raises(cudashim.UnsupportedCudaAPI, match="torch.autograd.profiler.emit_nvtx"):
        with torch.autograd.profiler.emit_nvtx():
            pass
    with pytest.raises(cudashim.UnsupportedCudaAPI, match="torch.cuda.profiler.start"):
        torch.cuda.profiler.start()
    torch.cuda.nvtx.mark("ranges are no refusal")
    cudashim.deactivate()


def test_nvtx_ranges_of_a_training_loop_show_in_a_profiler_trace(shim):
    from torch.profiler import ProfilerActivity, profile
    model = torch.nn.Linear(4, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    @torch.cuda.nvtx.range("optimizer step")
    def step():
        optimizer.step()

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(2):
            depth = torch.cuda.nvtx.range_push(f"iteration {i}")
            with torch.cuda.nvtx.range("forward {}", i):
                loss = model(torch.randn(2, 4, device="cuda")).sum()
            handle = torch.cuda.nvtx.range_start("backward")
            loss.backward()
            torch.cuda.nvtx.range_end(handle)
            step()
            torch.cuda.nvtx.mark("logged")
            assert torch.cuda.nvtx.range_pop() == depth == 0
    assert torch.cuda.nvtx.range_pop() == -1                # nothing left open
    names = [event.name for event in prof.events()]
    for expected in ("iteration 0", "iteration 1", "forward 0", "forward 1", "backward",
                     "optimizer step", "logged"):
        assert expected in names
    # Ranges nest as pushed: the forward's matmul is inside "forward 0".
    forward = next(e for e in prof.events() if e.name == "forward 0")
    assert any(child.name.startswith("aten::") for child in forward.cpu_children)


def test_a_program_profiling_with_nvtx_runs_under_the_launcher():
    program = (
        "import torch\n"
        "from torch.profiler import profile, ProfilerActivity\n"
        "model = torch.nn.Linear(4, 4).cuda()\n"
        "torch.cuda.profiler.start()\n"
        "with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:\n"
        "    for step in range(3):\n"
        "        torch.cuda.nvtx.range_push(f'step {step}')\n"
        "        with torch.autograd.profiler.emit_nvtx():\n"
        "            model(torch.randn(2, 4, device='cuda')).sum().backward()\n"
        "        torch.cuda.nvtx.range_pop()\n"
        "torch.cuda.profiler.stop()\n"
        "print(sorted(e.name for e in prof.events() if e.name.startswith('step')))\n")
    result = python("-m", "cudashim", "-c", program)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "['step 0', 'step 1', 'step 2']" in result.stdout
    assert result.stderr.count("does nothing on the 'cpu' backend") == 2    # start and stop, once each
    assert result.stderr.count("emit_nvtx records nothing") == 1
