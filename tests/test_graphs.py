"""CUDA graphs: capture records, replay recomputes, with CUDA's semantics.

The documentation's examples run as a program (tests/programs/cuda_graphs.py) on the CPU backend
and on the test accelerator, graphed and eagerly, and must agree; the rules of capture and
replay are checked one by one in-process on the CPU backend.
"""

import json
import sys
import weakref

import pytest
import torch

from conftest import python, use_fake_vendor
from targets import SHIMDEV, targets
from tolerances import reordered

pytestmark = pytest.mark.host          # inductor's generated code sums in the order the CPU's vector width gives


def _program(tmp_path, *options, target=None):
    out = tmp_path / f"{target.name if target else 'cpu'}.json"
    result = python("-m", "cudashim", *(target.options if target else ()),
                    "tests/programs/cuda_graphs.py", str(out), *options, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(out.read_text())


def _check_graphed_as_eager(seen, where):
    for name in ("whole_network", "whole_network_adam", "partial_network", "shared_pool", "decode"):
        assert seen[name]["graphed"] == seen[name]["eager"], f"{where}: {name}"
    assert len(seen["whole_network"]["graphed"]["losses"]) == 4
    assert len(set(seen["decode"]["graphed"]["tokens"])) > 1          # it generated, not repeated
    rules = seen["capture_rules"]
    assert rules["item"].startswith("CUDA error: operation not permitted when stream is capturing")
    assert rules["capturing_after"] is False
    assert "without a preceding successful capture" in rules["replay_after_failed_capture"]
    assert seen["randomness"] == {"fresh_each_replay": True, "reproducible": True, "as_eager": True}


def test_the_documentations_graphs_compute_what_eager_execution_does(tmp_path):
    """Whole-network capture of a training step (SGD with momentum, and Adam with
    ``capturable=True``), make_graphed_callables, a shared pool and a
    captured decode step: the same losses, parameters, gradients and tokens as eager, bit for
    bit; and torch.compile(mode="reduce-overhead") as the eager model (to float32's rounding of
    its sums: inductor fuses), on the CPU backend and the test accelerator."""
    cpu = _program(tmp_path, "--compile")
    _check_graphed_as_eager(cpu, "cpu")
    compiled = cpu["compiled"]
    # Inductor's fused code sums the Linear(8)s in its own order (AVX-512's differs from AVX2's).
    outputs = [torch.tensor(compiled[way]["outputs"], dtype=torch.float32) for way in ("graphed", "eager")]
    torch.testing.assert_close(*outputs, **reordered(torch.float32, terms=8, reductions=2))
    for target in targets(where=lambda target: target is SHIMDEV):
        _check_graphed_as_eager(_program(tmp_path, target=target), target.name)


# --- the rules, in-process on the CPU backend ----------------------------------------------
def _capture(body):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        held = body()
    return graph, held


def test_views_in_place_ops_and_aliases_replay_into_the_same_memory(shim):
    static = torch.zeros(4, 4, device="cuda")

    def body():
        row = static[1]                       # a view: nothing to replay, it sees the memory
        row.add_(1)                           # in place, through the view
        flat = static.view(16)
        total = static.sum(0)                 # new memory, filled on each replay
        doubled = (flat * 2).reshape(4, 4).t()
        return row, flat, total, doubled

    graph, (row, flat, total, doubled) = _capture(body)
    assert torch.equal(static, torch.zeros(4, 4))          # the capture wrote nothing CUDA would
    static.fill_(3)
    graph.replay()
    expected = torch.full((4, 4), 3.0)
    expected[1] += 1
    assert torch.equal(static, expected) and torch.equal(row, expected[1])
    assert flat.data_ptr() == static.data_ptr() and torch.equal(flat, expected.view(16))
    assert torch.equal(total, expected.sum(0)) and torch.equal(doubled, (expected * 2).t())
    graph.replay()                            # in-place work accumulates, as on CUDA
    assert torch.equal(static[1], torch.full((4,), 5.0))
    calls = graph._replay.calls               # views are not rerun
    assert len(calls) < len(graph._steps)


def test_tensors_from_before_the_capture_get_their_values_back_and_the_generator_its_state(shim):
    weight = torch.ones(3, device="cuda")
    torch.manual_seed(0)
    state = torch.cuda.get_rng_state()

    def body():
        weight.mul_(2)
        return weight + torch.rand(3, device="cuda")

    graph, out = _capture(body)
    assert torch.equal(weight, torch.ones(3)) and torch.equal(torch.cuda.get_rng_state(), state)
    graph.replay()
    assert torch.equal(weight, torch.full((3,), 2.0))
    torch.manual_seed(0)
    assert torch.equal(out, torch.full((3,), 2.0) + torch.rand(3))


def test_in_place_writes_into_memory_from_before_the_capture_are_left_to_the_replays(shim):
    """An inference engine's decoding step writes each token's keys into its cache in place:
    the capture runs none of it (as CUDA's), so it copies no cache to give its values back; each
    replay writes the rows at the positions of that replay. An in-place op that changes a
    view's sizes still does so at capture, and one whose sizes do not fit fails there."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Clones(TorchDispatchMode):              # beneath the recorder: sees what it copies
        sizes = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is torch.ops.aten.clone.default:
                self.sizes.append(args[0].numel())
            return func(*args, **(kwargs or {}))

    cache = torch.zeros(2, 64, 32, device="cuda")             # keys and values, 64 positions
    position = torch.tensor([0], device="cuda")
    token = torch.ones(1, 32, device="cuda")
    grown = torch.zeros(3, device="cuda")

    def body():
        cache[0].index_copy_(0, position, token)
        cache[1][position] = token * 2                # index_put_
        grown.unsqueeze_(0)
        return cache.sum(1)

    with Clones():
        graph, sums = _capture(body)
    assert all(size < 64 * 32 for size in Clones.sizes), Clones.sizes     # no layer of the cache
    assert torch.equal(cache, torch.zeros(2, 64, 32))
    assert grown.shape == (1, 3)
    for step in (5, 9):
        position.fill_(step)
        token.fill_(step)
        graph.replay()
        assert torch.equal(cache[0, step], torch.full((32,), float(step)))
        assert torch.equal(cache[1, step], torch.full((32,), 2.0 * step))
    assert torch.equal(sums, cache.sum(1)) and int(cache.count_nonzero()) == 4 * 32

    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            torch.zeros(4, device="cuda").add_(torch.ones(2, 4, device="cuda"))
    with pytest.raises(RuntimeError, match="doesn't match the broadcast shape"):
        with torch.cuda.graph(torch.cuda.CUDAGraph()):
            grown.add_(torch.ones(2, 3, device="cuda"))


@pytest.mark.parametrize("sync", [
    lambda x: x.sum().item(),
    lambda x: torch.nonzero(x),
    lambda x: x[x > 1],
    lambda x: torch.unique(x),
])
def test_a_host_sync_on_captured_work_raises_cudas_error(shim, sync):
    x = torch.ones(4, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="operation not permitted when stream is capturing") as info:
        with torch.cuda.graph(graph):
            sync(x * 2)
    assert isinstance(info.value, getattr(torch, "AcceleratorError", RuntimeError))
    assert not torch.cuda.is_current_stream_capturing()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        graph.replay()


def test_what_stays_on_the_device_is_allowed_during_capture(shim):
    x = torch.arange(6.0, device="cuda")
    host_value = torch.tensor(2.0)                # the capture never touches it
    graph, (picked, repeated) = _capture(lambda: (
        x[torch.tensor([0, 2])] * host_value.item(),
        torch.repeat_interleave(x, torch.full((6,), 2), output_size=12)))
    x.add_(1)
    graph.replay()
    assert torch.equal(picked, torch.tensor([2.0, 6.0])) and repeated.shape == (12,)
    assert torch.equal(repeated[::2], x)


def test_capture_end_after_a_broken_rule_raises_as_cuda_does(shim):
    graph = torch.cuda.CUDAGraph()
    graph.capture_begin()
    with pytest.raises(RuntimeError):
        (torch.ones(2, device="cuda") + 1).sum().item()
    with pytest.raises(RuntimeError, match="operation failed due to a previous error during capture"):
        graph.capture_end()
    assert not torch.cuda.is_current_stream_capturing()


def test_pools_handles_reset_and_misuse(shim, tmp_path):
    handle = torch.cuda.graph_pool_handle()
    assert isinstance(handle, tuple) and len(handle) == 2 and handle != torch.cuda.graph_pool_handle()
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        graph.pool()
    with pytest.raises(RuntimeError, match="Unknown capture error mode"):
        graph.capture_begin(capture_error_mode="loose")
    x = torch.ones(3, device="cuda")
    with torch.cuda.graph(graph, pool=handle):
        made = x * 2
    assert graph.pool() == handle
    with pytest.raises(RuntimeError, match="already owns a captured graph"):
        graph.capture_begin()
    with pytest.raises(shim.UnsupportedCudaAPI, match="raw_cuda_graph"):
        graph.raw_cuda_graph()
    graph.enable_debug_mode()
    graph.debug_dump(str(tmp_path / "graph.dot"))
    dot = (tmp_path / "graph.dot").read_text()
    assert dot.startswith("digraph") and "aten.mul.Tensor" in dot
    alive = weakref.ref(made)
    del made
    assert alive() is not None                # the graph keeps what its capture made
    graph.reset()
    assert alive() is None
    with pytest.raises(RuntimeError, match="without a preceding successful capture"):
        graph.replay()


def test_capture_begin_and_end_by_hand_on_a_side_stream(shim):
    static_in = torch.zeros(2, device="cuda")
    stream = torch.cuda.Stream()
    graph = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.stream(stream):
        graph.capture_begin()
        assert torch.cuda.is_current_stream_capturing()
        out = static_in.exp()
        graph.capture_end()
    static_in.fill_(1)
    graph.replay()                                # keep_graph: instantiated on first replay
    assert torch.equal(out, torch.full((2,), 1.0).exp())


def test_make_graphed_callables_keeps_the_modules_other_mode_eager(shim):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).cuda()
    reference = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5)).cuda()
    reference.load_state_dict(module.state_dict())
    graphed = torch.cuda.make_graphed_callables(module, (torch.randn(3, 4, device="cuda"),))
    assert graphed is module
    graphed.eval()                                # graphed in training mode: eval runs eagerly
    x = torch.randn(3, 4, device="cuda")
    assert torch.equal(graphed(x), reference.eval()(x))
    with pytest.raises(AssertionError, match="only Tensors"):
        torch.cuda.make_graphed_callables(lambda a, b: a, (x, 3))


def _vendor_graph_api(module, constructible=True):
    class NPUGraph:
        def __init__(self, keep_graph=False):
            if not constructible:
                raise RuntimeError("Tried to instantiate dummy base class _NPUGraph")

    class graph:
        def __init__(self, npu_graph, pool=None, stream=None):
            self.npu_graph = npu_graph

    module.NPUGraph, module.graph = NPUGraph, graph
    module.graph_pool_handle = lambda: (0, 99)
    module.make_graphed_callables = lambda callables, sample_args, **options: ("npu", callables)
    module.is_current_stream_capturing = lambda: False


def test_a_target_with_graphs_of_its_own_captures_with_them():
    use_fake_vendor("npu")
    import torch_npu  # noqa: F401
    import cudashim
    _vendor_graph_api(torch.npu)
    with cudashim.activated(backend="npu"):
        assert torch.cuda.CUDAGraph is torch.npu.NPUGraph and torch.cuda.graph is torch.npu.graph
        assert torch.cuda.graph_pool_handle() == (0, 99)
        assert torch.cuda.make_graphed_callables("f", ()) == ("npu", "f")


def test_a_graph_class_that_cannot_be_made_leaves_graphs_recorded():
    use_fake_vendor("npu")
    import torch_npu  # noqa: F401
    import cudashim
    _vendor_graph_api(torch.npu, constructible=False)
    with cudashim.activated(backend="npu"):
        assert torch.cuda.CUDAGraph is not torch.npu.NPUGraph
        assert type(torch.cuda.CUDAGraph()).__mro__[1].__module__ == "cudashim.graphs.graph"


def test_deactivation_gives_torch_its_own_graph_names_back():
    import cudashim
    real = torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.make_graphed_callables
    with cudashim.activated(backend="cpu"):
        assert torch.cuda.CUDAGraph is not real[0]
    assert (torch.cuda.CUDAGraph, torch.cuda.graph, torch.cuda.make_graphed_callables) == real
    assert "cudashim.graphs" not in str(sys.modules["torch.cuda"].graph)


def test_capturable_optimizers_step_on_the_target_and_the_table_comes_back():
    import cudashim
    import torch.optim.adam as adam
    table = adam._get_capturable_supported_devices
    assert "cpu" not in table()
    with cudashim.activated(backend="cpu"):
        model = torch.nn.Linear(2, 2).cuda()
        optimizer = torch.optim.AdamW(model.parameters(), capturable=True)
        model(torch.ones(1, 2, device="cuda")).sum().backward()
        optimizer.step()
        assert optimizer.state[model.weight]["step"].item() == 1
    assert adam._get_capturable_supported_devices is table


_RECORDER = ("cudashim.graphs.recording", "cudashim.graphs.replay", "cudashim.graphs.callables")


def test_the_recorder_is_imported_at_the_first_capture_not_at_activation():
    """The proxy binds CUDAGraph at every activation; what records and replays comes with the
    first capture, and a graph captured then replays as one captured with it loaded."""
    code = f"""if True:
        import json, sys, torch, cudashim
        cudashim.activate("cpu")
        loaded = lambda: [name for name in {_RECORDER!r} if name in sys.modules]
        seen = {{"activated": loaded(), "capturing": torch.cuda.is_current_stream_capturing()}}
        seen["asked"] = loaded()
        x = torch.ones(3, device="cuda")
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            y = x * 2
        x.fill_(5)
        g.replay()
        seen["replayed"], seen["captured"] = y.tolist(), loaded()
        print(json.dumps(seen))
    """
    result = python("-c", code)
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json.loads(result.stdout.strip().splitlines()[-1])
    assert seen["activated"] == seen["asked"] == [] and seen["capturing"] is False
    assert seen["replayed"] == [10.0, 10.0, 10.0]
    assert set(seen["captured"]) >= {"cudashim.graphs.recording", "cudashim.graphs.replay"}
