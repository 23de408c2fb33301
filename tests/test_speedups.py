"""The compiled fast paths behave as the pure-Python ones they stand in for.

Each hot wrapper (the device-argument rewriter, Tensor.cuda, Tensor.is_cuda, the torch.cuda
functions answered by who asks, torch.device) and each host kernel is run both ways on the
same inputs, errors included; the whole suite runs a second time with ``--pure-python``
(tox.ini), so every other test covers both too.
"""

import inspect
import sys
import warnings

import pytest
import torch

import cudashim
from cudashim import speedups
from cudashim._settings import load as load_settings
from cudashim.kernels import bits, error_buffer_size, native

from conftest import copy_of_cudashim, python

needs_compiled = pytest.mark.skipif(
    not speedups.built() or native._native is None or load_settings().pure_python,
    reason="the compiled fast paths were not built here, or this pass runs the fallback")

# (what, a call) pairs: values, odd values and bad values, as programs pass them.
CALLS = [
    ("to cuda", lambda t: t.to("cuda")),
    ("to cuda:0", lambda t: t.to("cuda:0")),
    ("to 0", lambda t: t.to(0)),
    ("to device", lambda t: t.to(torch.device("cuda", 0))),
    ("to dtype", lambda t: t.to(torch.float16)),
    ("to device= keyword", lambda t: t.to(device="cuda", dtype=torch.float64)),
    ("to cpu", lambda t: t.to("cpu")),
    ("to bad index", lambda t: t.to("cuda:7")),
    ("to negative", lambda t: t.to(-1)),
    ("to malformed", lambda t: t.to("cuda:x")),
    ("to True", lambda t: t.to(True)),
    ("zeros cuda", lambda t: torch.zeros(2, device="cuda")),
    ("zeros 0", lambda t: torch.zeros(2, device=0)),
    ("zeros None", lambda t: torch.zeros(2, device=None)),
    ("zeros unhashable", lambda t: torch.zeros(2, device=["cuda"])),
    ("zeros bad", lambda t: torch.zeros(2, device="cuda:3")),
    ("empty pinned", lambda t: torch.empty(2, device="cuda", pin_memory=True).fill_(1)),
    # a host staging buffer made pinned: known as pinned, as a pinned copy is; a device one is not
    ("staging buffers made pinned", lambda t: (
        torch.empty(2, pin_memory=True).is_pinned(), torch.zeros(2, pin_memory=True, dtype=torch.int8).is_pinned(),
        torch.empty(2, device="cuda", pin_memory=True).is_pinned(), torch.empty(2).is_pinned(),
        t.new_empty(2, pin_memory=True).is_pinned(), torch.empty(2, pin_memory=False).is_pinned())),
    ("new_zeros", lambda t: t.new_zeros(3, device="cuda")),
    ("cuda()", lambda t: t.cuda()),
    ("cuda(0)", lambda t: t.cuda(0)),
    ("cuda(device=)", lambda t: t.cuda(device="cuda:0", non_blocking=True)),
    ("cuda(9)", lambda t: t.cuda(9)),
    ("cuda(None)", lambda t: t.cuda(None)),
    ("is_cuda", lambda t: t.is_cuda),
    # moves where device memory is host memory: the tensor itself where a move placed it there
    # already, else a copy (each tuple: is the result the tensor moved)
    ("device tensor moved again", lambda t: (lambda d: (
        d.to("cuda") is d, d.to(0) is d, d.cuda() is d, d.to(device="cuda") is d, d.cpu() is d,
        d.to("cuda", torch.float64) is d, d.to(torch.float64) is d))(t.cuda())),
    ("host copy moved again", lambda t: (lambda h: (
        h.to("cpu") is h, h.cpu() is h, h.to(torch.device("cpu")) is h, h.to("cpu:0") is h,
        h.cuda() is h, h.to("meta").device.type))(t.cuda().cpu())),
    ("pinned moved", lambda t: (lambda p: (p.cpu() is p, p.to("cpu") is p, p.to("cuda") is p))(
        t.pin_memory())),
    ("moved to another tensor's side", lambda t: (lambda d: (t.to(d) is t, d.to(t) is d,
                                                             d.to(d) is d))(t.cuda())),
    ("unplaced tensor moved", lambda t: (t.cuda() is t, t.to("cuda") is t, t.cpu() is t)),
    ("copies made by moves", lambda t: copies_made(t)),
    ("devices read off tensors", lambda t: devices_read(t)),
    ("made like a tensor", lambda t: made_like(t)),
    ("placed tensor moved under a function mode", lambda t: moved_under_a_mode(t.cuda())),
    ("placed tensor moved in a JIT trace", lambda t: traced_moves(t.cuda())),
    ("device cuda", lambda t: torch.device("cuda")),
    ("device cuda, 0", lambda t: torch.device("cuda", 0)),
    ("device 0", lambda t: torch.device(0)),
    ("device type=", lambda t: torch.device(type="cuda", index=0)),
    ("device bad", lambda t: torch.device("gpu")),
    ("current_device", lambda t: torch.cuda.current_device()),
    ("device_count", lambda t: torch.cuda.device_count()),
    ("is_available", lambda t: torch.cuda.is_available()),
    ("set_device, then current", lambda t: (torch.cuda.set_device(0), torch.cuda.current_device())),
    ("get_device_name", lambda t: torch.cuda.get_device_name(0)),
]


class CountingMode(torch.overrides.TorchFunctionMode):
    calls = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.calls += 1
        return func(*args, **(kwargs or {}))


def moved_under_a_mode(device_tensor):
    """Each move of a tensor to where it is: whether it is the tensor, and whether a torch
    function mode saw a call for it (every call goes to the mode, as natively)."""
    seen = []
    with CountingMode() as mode:
        for move in (lambda d: d.to("cuda"), lambda d: d.cuda(), lambda d: d.cpu().cpu()):
            before = mode.calls
            seen.append((move(device_tensor) is device_tensor, mode.calls > before))
    return seen


def traced_moves(device_tensor):
    """The ops a JIT trace of moves to where the tensor is records (torch's to(), as natively)."""
    def moves(x):
        return x.to("cuda") + x.cuda() + x.cpu().cpu()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # the trace's own warnings about devices
        graph = torch.jit.trace(moves, (device_tensor,), check_trace=False).graph
    return sorted(node.kind() for node in graph.nodes() if node.kind().startswith("aten::"))


def copies_made(host):
    """What moves that copy leave: memory of their own, counted on the device while they live
    and forgotten when they die; a view of device memory stays; a sparse tensor is torch's."""
    from cudashim import activation
    sides = activation.current_activation().residency.sides
    known, counted = len(sides), torch.cuda.memory_allocated()
    device = host.cuda()
    seen = [device is not host, device.data_ptr() != host.data_ptr(), device.tolist(),
            torch.cuda.memory_allocated() - counted, len(sides) - known]
    view = device[1:]
    seen += [view.cuda() is view, view.to("cuda") is view, view.cpu().data_ptr() != view.data_ptr()]
    back = device.cpu()
    seen += [back is not device, back.data_ptr() != device.data_ptr(), back.cuda().data_ptr() != back.data_ptr()]
    sparse = host.to_sparse()
    seen += [sparse.cuda() is sparse, sparse.cpu() is sparse]
    seen.append(torch.nn.Parameter(host.clone()).cuda().__class__.__name__)   # a Tensor, as CUDA's
    del device, view, back
    seen += [torch.cuda.memory_allocated() - counted, len(sides) - known]
    return seen


def devices_read(host):
    """Which device object each tensor answers (the target's, the program's torch.device("cpu"),
    or torch's own), and what moves to them return."""
    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    device, copied = host.cuda(), host.cuda().cpu()
    made = torch.zeros(2, device="cuda")
    parameter = torch.nn.Parameter(torch.ones(2, device="cuda"))
    module = torch.nn.Linear(2, 2).cuda()
    module.to("meta")
    answers = [(tensor.device is cuda, tensor.device is cpu, str(tensor.device))
               for tensor in (device, copied, made, made[1:], parameter, parameter, host, host + 1,
                              module.weight, copied.pin_memory())]
    return answers + [host.to(device.device) is host, device.to(copied.device) is device,
                      device.to(device.device) is device, copied.to(copied.device) is copied,
                      host.to(host.device) is host, parameter.to(parameter.device) is parameter,
                      device.device == cuda, device.device.type, hash(device.device) == hash(cpu)]


def made_like(host):
    """Which tensors made like another are device memory (the count's growth) and answer the
    target's device: those made like a device tensor with no device named."""
    device, cuda = host.cuda(), torch.device("cuda")
    seen, kept = [], []
    for make in (lambda: torch.zeros_like(device), lambda: torch.ones_like(device, dtype=torch.float64),
                 lambda: device.new_zeros(5), lambda: device.new_tensor([1.0, 2.0]),
                 lambda: torch.zeros_like(host), lambda: host.new_ones(5),
                 lambda: torch.zeros_like(device, device="cpu"), lambda: host.new_zeros(5, device="cuda")):
        before = torch.cuda.memory_allocated()
        kept.append(make())
        seen.append((kept[-1].device is cuda, torch.cuda.memory_allocated() - before, kept[-1].tolist()))
    return seen


def outcome(call, tensor):
    try:
        value = call(tensor)
    except Exception as exc:               # the error is part of the behaviour
        return ("raised", type(exc).__name__, str(exc))
    if isinstance(value, torch.Tensor):
        return ("tensor", str(value.device), str(value.dtype), value.tolist(), value is tensor)
    return ("value", repr(value))


def outcomes(**options):
    cudashim.activate("cpu", **options)
    try:
        tensor = torch.arange(3.0)
        return {name: outcome(call, tensor) for name, call in CALLS}
    finally:
        cudashim.deactivate()


@needs_compiled
def test_compiled_wrappers_are_the_ones_that_run(shim):
    from cudashim import activation
    assert activation._current.compiled is speedups._compiled
    assert type(torch.Tensor.to).__name__ == "Rewriter"
    assert type(torch.zeros).__name__ == "Rewriter"
    assert type(torch.cuda.is_available).__name__ == "TruthSwitch"
    assert type(vars(torch.Tensor)["is_cuda"]).__name__ == "IsCuda"
    # where device memory is host memory (the CPU backend), the moves answer a tensor already there
    assert type(vars(torch.Tensor)["cpu"]).__name__ == "Stay"
    assert type(vars(torch.Tensor)["cuda"]).__name__ == "Stay"
    assert type(torch.Tensor.to.__wrapped__).__name__ == "Stay"
    assert inspect.unwrap(torch.Tensor.to.python_twin) is torch._C.TensorBase.to


@needs_compiled
def test_compiled_and_pure_python_wrappers_agree_on_every_call():
    compiled, pure = outcomes(), outcomes(pure_python=True)
    assert compiled == pure
    # and the table is not trivially equal: translations, refusals and passes-through differ
    assert compiled["to cuda"][0] == "tensor" and compiled["to bad index"][0] == "raised"
    assert "invalid device ordinal" in compiled["cuda(9)"][2]
    assert compiled["device tensor moved again"] == ("value", repr((True,) * 4 + (False,) * 3))
    # torch copies to "cpu:0" itself: a host tensor's device has no index
    assert compiled["placed tensor moved under a function mode"] == (
        "value", repr([(True, True), (True, True), (False, True)]))
    assert compiled["placed tensor moved in a JIT trace"][1].count("aten::to") >= 2
    assert compiled["host copy moved again"] == ("value", repr((True,) * 3 + (False, False, "meta")))
    assert compiled["copies made by moves"] == ("value", repr(
        [True, True, [0.0, 1.0, 2.0], 12, 1, True, True, True, True, True, True, True, True, "Tensor", 0, 0]))
    assert compiled["staging buffers made pinned"] == ("value", repr((True, True, False, False, True, False)))


def test_pure_python_setting_runs_the_python_wrappers():
    cudashim.activate("cpu", pure_python=True)
    from cudashim import activation
    assert activation._current.compiled is None
    assert type(torch.Tensor.to).__name__ == "function"
    assert type(vars(torch.Tensor)["is_cuda"]) is property
    assert "pure Python" in speedups.describe(activation._current.settings)


@pytest.mark.parametrize("pure_python", [False, True])
def test_torch_internals_hear_the_truth_through_either_wrapper(pure_python):
    question = "answers = (t.is_cuda, torch.cuda.is_available(), torch.cuda.device_count())"
    truth = {"__name__": "torch._probe", "torch": torch, "t": torch.ones(2)}
    exec(question, truth)                 # this machine's CUDA, as torch says before activation
    cudashim.activate("cpu", pure_python=pure_python)
    t = torch.ones(2)
    as_torch = {"__name__": "torch._probe", "torch": torch, "t": t}
    as_program = {"__name__": "train", "torch": torch, "t": t}
    exec(question, as_torch)
    exec(question, as_program)
    assert as_program["answers"] == (True, True, 1)
    assert as_torch["answers"] == truth["answers"]
    assert as_torch["answers"] != as_program["answers"]


@needs_compiled
def test_each_activation_decides_who_hears_the_truth_afresh():
    """The compiled caller cache belongs to the activation: the next one, told otherwise,
    answers otherwise for the same code."""
    code = compile("answer = t.is_cuda", "mylib.py", "exec")
    namespace = {"__name__": "mylib", "t": torch.ones(1)}
    cudashim.activate("cpu")
    exec(code, namespace)
    assert namespace["answer"] is True
    cudashim.deactivate()
    cudashim.activate("cpu", honest_for="mylib")
    exec(code, namespace)
    assert namespace["answer"] is False


@needs_compiled
def test_a_translated_call_keeps_no_reference_behind():
    cudashim.activate("cpu")
    t = torch.ones(2)
    spec = "cuda:0"
    # The translator's cache keeps the spec it parsed, once; each compiled wrapper keeps the
    # object it translated last (one reference, not one a call).
    for _ in range(2):
        t.to(spec)
        torch.zeros(1, device=spec)
        t.cuda()
    before = sys.getrefcount(spec), sys.getrefcount(t)
    for _ in range(1000):
        t.to(spec)
        torch.zeros(1, device=spec)
        t.cuda()
    assert (sys.getrefcount(spec), sys.getrefcount(t)) == before


@pytest.mark.parametrize("pure_python", [False, True])
def test_torch_compile_traces_through_the_wrappers(pure_python):
    import torch._dynamo
    cudashim.activate("cpu", pure_python=pure_python)

    def step(x):
        y = torch.zeros(4, device="cuda") + x.to("cuda")
        return y * 2 + torch.ones(4, device=torch.device("cuda"))

    x = torch.randn(4)
    explained = torch._dynamo.explain(step)(x)
    reasons = " ".join(str(b.reason) for b in explained.break_reasons)
    assert "Rewriter" not in reasons and "TruthSwitch" not in reasons
    assert explained.graph_break_count == 0
    assert torch.equal(torch.compile(step)(x), step(x))


@pytest.mark.torch_range
@pytest.mark.parametrize("pure_python", [False, True])
def test_torch_compile_traces_the_float16_policys_gate_under_autocast(pure_python):
    """Where float16 is slow the policy gates F.linear; torch 2.7's dynamo guards the twin it
    traces through the wrapper's own name (F.linear.__closure__), which the wrapper answers."""
    cudashim.activate("cpu", pure_python=pure_python, host_profile="slow")
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8).cuda()

    def step(x):
        with torch.autocast("cuda", dtype=torch.float16):
            return model(x).float().sum()

    x = torch.randn(4, 8, device="cuda")
    assert torch.compile(step)(x).item() == pytest.approx(step(x).item(), rel=1e-2)


# --- kernels -------------------------------------------------------------------------------

def _variant_names():
    return [v.name for v in native.variants()] or ["none built"]


@pytest.fixture(params=_variant_names())
def variant(request):
    """Each instruction-set variant of the host kernels in turn, where this CPU runs it."""
    found = {v.name: v for v in native.variants()}
    if request.param not in found:
        pytest.skip("the compiled kernels were not built")
    if not found[request.param].runs_here:
        pytest.skip(f"this CPU cannot run the {request.param} kernels (they need {found[request.param].needs})")
    with native.using_variant(request.param):
        yield request.param


@needs_compiled
def test_a_first_use_while_torch_compile_compiles_leaves_the_variant_to_the_next(monkeypatch):
    """The variant is chosen at the first use, which can come while torch.compile compiles (a
    compiled float16 layer's conversion): the probe's long sums are left out of compiled code
    there, and every variant was refused for the rest of the process. The portable versions
    serve that use; the first one after it chooses, as any other would."""
    monkeypatch.setattr(native, "_choice", None)
    monkeypatch.setattr(native, "_choice_failed", False)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert "torch.compile" in native.unavailable() and not native.usable()
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: False)
    widest = next((v.name for v in native.variants() if v.runs_here), None)
    assert native.variant() == widest is not None and native.usable()


@needs_compiled
@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1001, 65536 + 3])
@pytest.mark.parametrize("bitorder", ["big", "little"])
def test_compiled_bit_kernels_match_the_portable_ones(n, bitorder, variant):
    torch.manual_seed(n)
    flags = torch.rand(n) < 0.5
    counts = torch.randint(0, 3, (n,), dtype=torch.int32)
    assert torch.equal(native.packbits(flags, bitorder), bits.packbits(flags, bitorder))
    assert torch.equal(native.packbits(counts, bitorder), bits.packbits(counts, bitorder))
    packed = torch.randint(0, 256, (n,), dtype=torch.uint8)
    for count in (None, 3 * n, -min(n, 5)):
        assert torch.equal(native.unpackbits(packed, count, bitorder), bits.unpackbits(packed, count, bitorder))
    floats = torch.randn(n)
    floats[::5] = 0.0
    floats[1::7] = -0.0
    floats[2::11] = float("nan")
    assert torch.equal(native.pack_signs(floats), bits.pack_signs(floats))
    assert torch.equal(native.unpack_signs(packed, n), bits.unpack_signs(packed, n))


def _every_value(dtype):
    """The 65536 values of a 16-bit floating-point type, NaNs and infinities among them."""
    return torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16).view(dtype)


def _same_values(ours, torchs):
    """Equal bit for bit, but for which NaN: torch's own kernels quiet a NaN differently."""
    nan = torchs.isnan()
    return ours.dtype == torchs.dtype and ours.shape == torchs.shape and torch.equal(ours.isnan(), nan) \
        and torch.equal(ours[~nan].view(torch.int16), torchs[~nan].view(torch.int16))


@needs_compiled
@pytest.mark.parametrize("source, target", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("threads", [1, 3])
def test_compiled_conversions_between_float16_and_bfloat16_give_torchs_values(source, target, threads,
                                                                               variant, bfloat16_instructions,
                                                                               monkeypatch):
    """Every value of the type, in a tensor split over threads, and lengths that end in every
    vector loop's tail: the values torch's ``.to`` gives."""
    if not native._native.convert_reduced(0, 0, 0, True, 1):     # no F16C, or SSE2 alone
        assert native.reduced_converted(_every_value(source), target) is None
        return
    monkeypatch.setattr(native, "_threads", lambda: threads)
    monkeypatch.setattr(native, "_CONVERSION_ELEMENTS_PER_THREAD", 1 << 10)
    every = _every_value(source)
    many = every.repeat(9)                         # long enough to be split (2^18 a part at least)
    assert _same_values(native.reduced_converted(many, target), many.to(target))
    for n in (0, 1, 7, 15, 17, 1001):
        part = every[3 * n:4 * n + 1].clone()
        assert _same_values(native.reduced_converted(part, target), part.to(target)), n
    channels_last = every[:2 * 3 * 8 * 8].reshape(2, 3, 8, 8).contiguous(memory_format=torch.channels_last)
    ours = native.reduced_converted(channels_last, target)
    assert ours.is_contiguous(memory_format=torch.channels_last)
    assert _same_values(ours, channels_last.to(target))
    # a head of a fused projection, with gaps between its rows: converted into the layout
    # torch's own conversion gives it (dense, in the order its dimensions lie in memory)
    heads = every[:4 * 16 * 3 * 32].reshape(4, 16, 3 * 32)[..., 32:64].view(4, 16, 2, 16).transpose(1, 2)
    ours = native.reduced_converted(heads, target)
    assert not ours.is_contiguous() and ours.stride() == heads.to(target).stride()
    assert _same_values(ours, heads.to(target))
    # attention's output, dense in another order of its dimensions: converted as it lies
    permuted = every[:4 * 16 * 32].reshape(4, 16, 2, 16).transpose(1, 2)
    ours = native.reduced_converted(permuted, target)
    assert ours.stride() == permuted.stride() and _same_values(ours, permuted.to(target))
    assert native.reduced_converted(heads, target, out=torch.empty(heads.shape, dtype=target)) is None


@pytest.fixture(params=["AVX512-BF16 where the CPU has it", "integer rounding"])
def bfloat16_instructions(request):
    """AVX512-BF16's conversions to bfloat16 where the CPU has them, then the integer rounding
    that AVX-512 CPUs without them run."""
    used = native._native.use_avx512bf16(request.param != "integer rounding")
    yield request.param
    native._native.use_avx512bf16(used)


@needs_compiled
@pytest.mark.parametrize("source, target", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)])
def test_the_transposing_conversion_gives_torchs_values_laid_out_channels_last_and_back(source, target, variant,
                                                                                        bfloat16_instructions):
    """A channel-first activation converted into channels-last memory and back, in one pass
    (the packed convolutions' inputs and results): every value of the type, as torch's
    ``.to`` converts it, where torch's permuting copy puts it; matrices whose sides end in
    every edge the 8 x 8 blocks and 32 x 32 tiles leave, and one split over threads."""
    if not native.converted_transposed_into(torch.empty(0, dtype=source), torch.empty(0, dtype=target),
                                            target, 0, 0, 0):
        pytest.skip(f"the {variant} kernels have no conversion loops (they need F16C and AVX2)")
    every = _every_value(source)
    for batch, channels, height, width in ((2, 3, 5, 7), (1, 8, 8, 8), (3, 33, 9, 4), (2, 64, 40, 41),
                                           (1, 1, 1, 1), (4, 130, 1, 1)):
        count = batch * channels * height * width
        x = every.repeat(count // every.numel() + 1)[7:7 + count].reshape(batch, channels, height, width)
        last = torch.empty_like(x, dtype=target, memory_format=torch.channels_last)
        assert native.converted_transposed_into(x, last, target, batch, channels, height * width)
        assert last.is_contiguous(memory_format=torch.channels_last)
        assert _same_values(last.contiguous(), x.to(target)), (batch, channels, height, width)
        back = torch.empty(x.shape, dtype=source)
        assert native.converted_transposed_into(last, back, source, batch, height * width, channels)
        assert _same_values(back, last.to(source).contiguous())
    many = every.repeat(9).reshape(9 * 256, 256)               # long enough to be split over threads
    out = torch.empty(256, 9 * 256, dtype=target)
    assert native._native.convert_reduced_transposed(many.data_ptr(), out.data_ptr(), 1, 9 * 256, 256,
                                                     target is torch.bfloat16, 3)
    assert _same_values(out, many.t().to(target))


@needs_compiled
def test_the_compiled_conversion_leaves_to_torch_what_it_cannot_convert_as_torch_does():
    """A tensor autograd records (the copy must be on its graph), another dtype, and a
    subclass are torch's to convert."""
    weights = torch.randn(64).half().requires_grad_()
    assert native.reduced_converted(weights, torch.bfloat16) is None
    with torch.no_grad():
        plain = native.reduced_converted(weights, torch.bfloat16)
    if plain is not None:                                  # where the CPU has F16C
        assert not plain.requires_grad and torch.equal(plain, weights.detach().to(torch.bfloat16))
    halves = torch.randn(8, 8).half()
    assert native.reduced_converted(halves, torch.float32) is None
    assert native.reduced_converted(halves.float(), torch.bfloat16) is None

    class Marked(torch.Tensor):
        pass
    assert native.reduced_converted(halves.as_subclass(Marked), torch.bfloat16) is None


def _compression_steps(buffer, world):
    """One rank's compression steps from zero errors, as compressed_allreduce runs them
    (the server side is fed this rank's own signs, world times, with made-up scales)."""
    from cudashim.kernels import compressed
    size = error_buffer_size(buffer.numel(), world)
    worker_error, server_error = torch.zeros(size), torch.zeros(size // world)
    worker_error[buffer.numel():] = 0.25                  # the padding's own carried error
    worker_scale, packed = compressed.compensate_and_compress(buffer, worker_error)
    scales = torch.arange(1, world + 1, dtype=torch.float32) * worker_scale
    server_scale, server_packed = compressed.server_compress(packed, scales, server_error)
    result = torch.empty_like(buffer)
    compressed.expand_into(result, packed, scales)
    return {"worker_scale": worker_scale, "packed": packed, "worker_error": worker_error,
            "server_scale": server_scale, "server_packed": server_packed,
            "server_error": server_error, "result": result}


@needs_compiled
@pytest.mark.parametrize("world, numel", [(2, 8 * 1000), (4, 999), (2, 600_003)])
def test_compiled_compression_matches_the_portable_one(world, numel, variant):
    torch.manual_seed(numel)
    buffer = torch.randn(numel)
    buffer[::97] = 0.0
    mine = _compression_steps(buffer.clone(), world)
    with native.portable_only():
        theirs = _compression_steps(buffer.clone(), world)
    # The signs and the expanded result agree bit for bit; the scales and what depends on
    # them to float32 summation error (the compiled norm is folded in double precision).
    for key in ("packed", "server_packed", "result"):
        if key == "result":
            torch.testing.assert_close(mine[key], theirs[key], rtol=1e-5, atol=0)
        else:
            assert torch.equal(mine[key], theirs[key]), key
    for key in ("worker_scale", "server_scale", "worker_error", "server_error"):
        torch.testing.assert_close(mine[key], theirs[key], rtol=1e-4, atol=1e-4)
    # ... and the compiled worker scale is the float64 one, where torch's float32 norm drifts
    size = error_buffer_size(numel, world)
    x = torch.full((size,), 0.25, dtype=torch.float64)
    x[:numel] = buffer
    exact = x.norm() / size ** 0.5
    assert abs(mine["worker_scale"].item() / exact.item() - 1) < 1e-6


@needs_compiled
def test_every_variant_gives_the_same_bits_as_the_one_chosen():
    """The variants differ in instruction set only: the scales too are equal bit for bit."""
    torch.manual_seed(5)
    buffer = torch.randn(300_001)
    chosen = _compression_steps(buffer.clone(), world=2)
    runnable = [v.name for v in native.variants() if v.runs_here]
    assert native.variant() == runnable[0]             # the widest, where it agrees
    for name in runnable[1:]:
        with native.using_variant(name):
            other = _compression_steps(buffer.clone(), world=2)
        for key, value in chosen.items():
            assert torch.equal(value, other[key]), (name, key)


@needs_compiled
def test_doctor_names_the_variant_that_runs_and_what_the_others_need():
    from cudashim.doctor import host_kernels_line
    line = host_kernels_line()
    assert f"the {native.variant()} variant" in line
    for v in native.variants():
        assert (f"{v.name}: this CPU lacks {v.needs}" in line) == (not v.runs_here), line


@needs_compiled
def test_a_variant_this_cpu_cannot_run_is_refused_by_name():
    missing = [v for v in native.variants() if not v.runs_here]
    with pytest.raises(ValueError, match="no host-kernel variant named 'mmx'"):
        with native.using_variant("mmx"):
            pass
    for v in missing:
        with pytest.raises(ValueError, match=f"cannot run the {v.name} host kernels"):
            with native.using_variant(v.name):
                pass


@needs_compiled
def test_a_variant_that_disagrees_with_the_portable_version_is_passed_over(monkeypatch, caplog):
    """The probe run at first use: a variant whose packing is wrong is logged and skipped."""
    runnable = [v.name for v in native.variants() if v.runs_here]
    monkeypatch.setattr(native, "_choice", None)
    monkeypatch.setattr(native, "_choice_failed", False)
    real_packbits = native.packbits

    def broken_in_the_widest(x, bitorder="big"):
        out = real_packbits(x, bitorder)
        return out ^ 1 if native._native.variant() == runnable[0] else out
    monkeypatch.setattr(native, "packbits", broken_in_the_widest)
    with caplog.at_level("WARNING", logger="cudashim.kernels.native"):
        reason = native.unavailable()
    if len(runnable) == 1:
        assert reason == "no variant of the compiled kernels agrees with the portable versions"
    else:
        assert reason is None and native.variant() == runnable[1]
    assert f"the {runnable[0]} host kernels are not used: packbits (big)" in caplog.text
    monkeypatch.undo()
    native._choice = None                      # chosen afresh: the widest again
    assert native.unavailable() is None and native.variant() == runnable[0]


@needs_compiled
@pytest.mark.parametrize("threads", [1, 3])
def test_compiled_bit_kernels_match_numpy_when_split_over_threads(threads, variant):
    import numpy as np
    torch.set_num_threads(threads)
    torch.manual_seed(threads)
    flags = torch.rand(8 * 2**20 + 13) < 0.5          # long enough to be split over threads
    for bitorder in ("big", "little"):
        packed = native.packbits(flags, bitorder)
        assert np.array_equal(packed.numpy(), np.packbits(flags.numpy(), bitorder=bitorder))
        assert np.array_equal(native.unpackbits(packed, bitorder=bitorder).numpy(),
                              np.unpackbits(packed.numpy(), bitorder=bitorder))


@needs_compiled
def test_compiled_compression_does_not_depend_on_the_thread_count():
    torch.manual_seed(0)
    buffer = torch.randn(1_500_001)          # long enough to be split over threads
    runs = []
    for threads in (1, 2, 3):
        torch.set_num_threads(threads)
        runs.append(_compression_steps(buffer.clone(), world=2))
    for other in runs[1:]:
        for key, value in runs[0].items():
            assert torch.equal(value, other[key]), key


@needs_compiled
def test_pure_python_setting_turns_the_compiled_kernels_off(tmp_path):
    # Started outside the checkout, so that it imports the installed package, as the test
    # process does (from the repository root, ``-c`` would import the sources, unbuilt).
    result = python("-c", "from cudashim.kernels import native; print(native.why_not_used())",
                    env={"CUDASHIM_PURE_PYTHON": "1"}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "pure_python setting" in result.stdout


@needs_compiled
def test_the_activations_pure_python_setting_reaches_the_host_kernels():
    """As a keyword, with no variable set: the kernels hear the activation, and deactivation
    gives them back their own choice."""
    import numpy as np
    from cudashim.kernels import packbits
    flags = torch.arange(64) % 3 == 0
    assert native.usable()
    cudashim.activate("cpu", pure_python=True)
    assert not native.usable() and packbits.implementation("cpu") is packbits.portable
    assert torch.equal(packbits(flags), torch.from_numpy(np.packbits(flags.numpy())))
    cudashim.deactivate()
    assert native.usable() and packbits.implementation("cpu") is not packbits.portable


@needs_compiled
def test_the_launcher_runs_the_compiled_wrappers_unless_asked_not_to(tmp_path):
    """Under ``python -m cudashim``: compiled by default, Python with --pure-python, the same
    answers either way (a translated tensor, is_cuda, the current device)."""
    program = ("import torch; t = torch.ones(2).cuda(); "
               "print(type(torch.zeros).__name__, t.is_cuda, t.device, torch.cuda.current_device())")
    answers = {}
    for flags in ((), ("--pure-python",)):
        result = python("-m", "cudashim", "--backend", "cpu", *flags, "-c", program, cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        answers[flags] = result.stdout.split()
    assert answers[()] == ["Rewriter", "True", "cpu", "0"]
    assert answers[("--pure-python",)] == ["function", "True", "cpu", "0"]


@needs_compiled
def test_a_compiled_rewriter_takes_as_many_slots_and_classes_as_its_declaration_has():
    """No limit in C to keep in step with Python: seven slots, one with eleven classes, and a
    translation that raises leaves every argument as it was."""
    from cudashim import _speedups

    def original(*args, **kwargs):
        return args, kwargs

    def upper(value):
        if value == "boom":
            raise ValueError("bad device")
        return value.upper()

    unchanged = object()
    classes = (str,) + tuple(type(f"Class{i}", (), {}) for i in range(10))
    slots = tuple((None, f"k{i}", None, upper, None, None, unchanged) for i in range(6))
    slots += ((0, "first", classes, upper, None, None, unchanged),)
    rewriter = _speedups.Rewriter(original, slots)
    keywords = {f"k{i}": f"d{i}" for i in range(6)}
    assert rewriter("cuda", **keywords) == (("CUDA",), {f"k{i}": f"D{i}" for i in range(6)})
    assert rewriter(1, k5="x") == ((1,), {"k5": "X"})            # an int is none of the classes
    with pytest.raises(ValueError, match="bad device"):
        rewriter("cuda", k0="x", k1="boom")
    assert rewriter("a", k3="b") == (("A",), {"k3": "B"})         # and it still works after
    many = rewriter(*["x"] * 20, k0="y")                            # past the arguments kept on the stack
    assert many == (("X",) + ("x",) * 19, {"k0": "Y"})


@needs_compiled
def test_a_compiled_translation_answers_an_object_seen_last_as_the_caches_do():
    """The compiled translation keeps the object it last found in the caches, and answers it
    again without a lookup: each of two specs taking turns still gets its own translation,
    a spec whose equality is its class's own (it may change) is looked up on every call, and
    nothing is held but the one object kept and its translation."""
    from cudashim import _speedups

    unchanged, target = object(), torch.device("meta")
    device = torch.device("cuda", 0)
    cache = {"cuda": target, "cpu": unchanged, device: target}
    indices = {0: target}
    misses = []

    def translate(value):
        misses.append(value)
        return value

    rewriter = _speedups.Rewriter(lambda *args, **kwargs: (args, kwargs),
                                  ((0, "device", None, translate, cache, indices, unchanged),))
    cuda, cpu = "cuda", "cpu"
    counts = sys.getrefcount(cuda), sys.getrefcount(cpu), sys.getrefcount(device)
    for _ in range(100):
        assert rewriter(cuda)[0] == (target,)
        assert rewriter(cpu)[0][0] is cpu
        assert rewriter(device=device)[1] == {"device": target}
        assert rewriter(0)[0] == (target,)
    assert misses == []
    # One reference more at most, to the object kept last: none for the others.
    assert sys.getrefcount(cuda) - counts[0] == 0 and sys.getrefcount(cpu) - counts[1] == 0
    assert sys.getrefcount(device) - counts[2] == 0

    class Spec(str):
        """A spec whose equality follows what it names now."""
        def __hash__(self):
            return hash(self.now)

        def __eq__(self, other):
            return self.now == other

    spec = Spec("either")
    for now, expected in (("cuda", target), ("cpu", spec), ("cuda", target), ("cpu", spec)):
        spec.now = now
        assert rewriter(spec)[0][0] is expected, now
    assert misses == []


@needs_compiled
def test_the_compiled_module_has_exactly_the_twins_the_table_names():
    """tables/compiled_twins.py is the table of C twins: the module has no type it does not
    name, and each Python original it names exists."""
    import importlib

    from cudashim import _speedups
    from cudashim.tables.compiled_twins import TWINS
    types_in_module = {name for name, value in vars(_speedups).items() if isinstance(value, type)}
    assert types_in_module == set(TWINS)
    for twin, _ in TWINS.values():
        module, _, attribute = twin.partition(":")
        assert callable(getattr(importlib.import_module(module), attribute)), twin


@needs_compiled
def test_the_search_for_a_displaced_librarys_references_finds_what_python_finds():
    """``_speedups.holding``, which activation runs over every imported module where a stand-in
    displaces a library imported before it, names the modules Python's twin names: a module
    held under another name, a function imported by name, nothing at all."""
    import types

    from cudashim import _speedups
    from cudashim.substitutes.finder import _holding

    library = types.ModuleType("library")
    library.function = lambda: None
    aliased, imported, neither = (types.ModuleType(name) for name in ("aliased", "imported", "neither"))
    aliased.lib = library
    imported.function = library.function
    neither.function = lambda: None                        # equal in name, not in identity
    modules = [m for m in list(sys.modules.values()) if isinstance(m, types.ModuleType)]
    modules += [aliased, imported, neither, "not a module"]
    for objects in ([library, library.function], [library], (library.function,), [], [sys]):
        compiled = _speedups.holding(modules, objects)
        assert compiled == _holding(modules, objects), objects
    assert _speedups.holding(modules, [library, library.function])[-2:] == [aliased, imported]
    assert _speedups.holding(modules, [library]) == [aliased]
    assert sys.modules["os"] in _speedups.holding(modules, [sys])
    with pytest.raises(TypeError):
        _speedups.holding(modules, 3)


@needs_compiled
def test_a_build_made_for_another_table_of_twins_does_not_load_and_python_runs(tmp_path):
    """A stale build (a type the table no longer names) refuses to load, saying why; the
    pure-Python wrappers run and the fast-path line says what happened."""
    package = copy_of_cudashim(tmp_path)
    table = package / "tables" / "compiled_twins.py"
    table.write_text(table.read_text().replace('    "NamedDevice"', '    "RenamedDevice"'))
    code = ("import torch, cudashim\n"
            "from cudashim import speedups\n"
            "cudashim.activate('cpu')\n"
            "print(speedups.built())\n"
            "print(speedups.fast_path(cudashim._settings.load()))\n"
            "print(torch.ones(1).cuda().is_cuda)\n")
    result = python("-c", code, env={"PYTHONPATH": str(tmp_path)}, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    built, line, works = result.stdout.strip().splitlines()
    assert built == "False" and works == "True"
    assert "built with NamedDevice, which the table of twins does not name" in line, line


def _at_once_calls():
    """(what, function, operands, keywords): the calls the float16 policy's one-frame path is
    handed in inference, and the ones it must hand on."""
    import torch.nn.functional as F
    torch.manual_seed(7)
    x, wide_x = torch.randn(4, 16).half(), torch.randn(4, 32).half()
    weight = torch.nn.Parameter(torch.randn(8, 16).half(), requires_grad=False)
    bias = torch.nn.Parameter(torch.randn(8).half(), requires_grad=False)
    unkept = torch.nn.Parameter(torch.randn(8, 16).half(), requires_grad=False)
    image = torch.randn(2, 3, 8, 8).half()
    filters = torch.nn.Parameter(torch.randn(4, 3, 3, 3).half(), requires_grad=False)
    fused = torch.randn(2, 4, 3 * 16).half()
    q, k, v = (t.view(2, 4, 2, 8).transpose(1, 2) for t in fused.split(16, dim=2))
    stacked = torch.randn(3, 4, 16).half()
    memory = torch.randn(4 * fused.numel()).half().untyped_storage()
    laid = torch.empty(0, dtype=torch.float16).set_(memory, fused.numel(), fused.size())
    before = laid.as_strided(q.size(), (192, 8, 48, 1), 0)           # its first element outside
    k2, v2 = (t.view(2, 4, 2, 8).transpose(1, 2) for t in laid.split(16, dim=2)[1:])

    def refused(*tensors):
        raise ValueError("refused")
    return [
        ("a layer's projection", F.linear, (x, weight, bias), {}),
        ("again, from the kept buffer", F.linear, (x, weight, bias), {}),
        ("another size", F.linear, (wide_x[:, :16].contiguous(), weight), {}),
        ("a view of one tensor", F.linear, (wide_x.view(4, 2, 16)[:, 0], weight), {}),
        ("an operand laid out otherwise", torch.mm, (x, weight.t()), {}),
        ("plain operands only", torch.mm, (x, x.t().contiguous()), {}),
        ("a parameter with no kept copy", F.linear, (x, unkept), {}),
        ("a tensor among the keywords", F.linear, (x,), {"weight": weight}),
        ("other keywords", torch.matmul, (x, x.t().contiguous()), {}),
        ("a convolution's sizes", F.conv2d, (image, filters, None, (2, 2), [1, 1], (1, 1), 1), {}),
        ("its sizes among the keywords", F.conv2d, (image, filters), {"stride": (2, 2), "padding": 1}),
        ("operands in a list", torch.einsum, ("ij,jk->ik", [x, x.t().contiguous()]), {}),
        ("operands in a list among the keywords", lambda tensors: torch.cat(tensors), (),
         {"tensors": ((x,), [x])}),
        ("views split off one projection", F.scaled_dot_product_attention, (q, k, v), {"is_causal": True}),
        ("row-major views making up one tensor", torch.addcmul, stacked.unbind(0), {}),
        ("views making up part of their tensor", F.scaled_dot_product_attention, (q, k, v.contiguous()), {}),
        ("a view reaching before its tensor", F.scaled_dot_product_attention, (before, k2, v2), {}),
        ("a result that is its operand's view", lambda t: t.view(-1), (x,), {}),
        ("a result that is a tuple", lambda a, b: (a @ b, a + 1), (x, x.t().contiguous()), {}),
        ("an error", refused, (x, weight), {}),
    ], (weight, bias, filters)


def _at_once_outcomes(at_once, dtype, portable=False):
    import contextlib

    from cudashim.patches.precision import _SCRATCH, WideningCache
    calls, kept = _at_once_calls()
    cache = WideningCache()
    for parameter in kept:
        cache.widen(parameter, dtype)
    _SCRATCH.clear()
    found = {}
    with torch.no_grad(), native.portable_only() if portable else contextlib.nullcontext():
        for what, function, operands, keywords in calls:
            before = [t.clone() for t in operands if isinstance(t, torch.Tensor)]
            try:
                result = at_once(function, dtype, cache, operands, keywords)
            except ValueError as error:
                result = error
            results = result if isinstance(result, tuple) else (result,)
            found[what] = (
                [(r.dtype, r.shape, r.stride(), r._base is None, r.tolist()) if isinstance(r, torch.Tensor)
                 else repr(r) for r in results],
                {nbytes: len(buffers) for nbytes, buffers in _SCRATCH.free.items()},
                _SCRATCH.held, len(_SCRATCH.lent),
                all(torch.equal(a, b) for a, b in zip(before, [t for t in operands if isinstance(t, torch.Tensor)])))
    return found


@needs_compiled
@pytest.mark.parametrize("dtype, portable", [(torch.bfloat16, False), (torch.bfloat16, True),
                                             (torch.float32, False)])
def test_the_compiled_one_frame_path_and_its_twin_agree_on_every_call(dtype, portable):
    """The float16 policy's call of inference in one frame (``_at_once``), compiled and in
    Python, on the same calls: the same results (values, layout, memory of their own), the same
    buffers kept after each call, the operands untouched; the calls it hands on handed on."""
    from cudashim import _speedups
    from cudashim.patches.precision import _at_once, _at_once_for
    compiled = _at_once_for(_speedups)
    assert type(compiled).__name__ == "AtOnce" and compiled.python_twin is _at_once
    ours, twins = _at_once_outcomes(compiled, dtype, portable), _at_once_outcomes(_at_once, dtype, portable)
    assert ours == twins
    # and the outcomes differ where they should: some calls are computed, some handed on
    results = {what: outcome[0] for what, outcome in ours.items()}
    assert results["a layer's projection"][0][0] is torch.float16
    assert results["a layer's projection"] == results["again, from the kept buffer"]
    assert results["a parameter with no kept copy"] == results["a tensor among the keywords"] == ["NotImplemented"]
    # a convolution's sizes are values, taken; tensors in a list, at any depth, are handed on
    assert results["a convolution's sizes"][0][0] is torch.float16
    assert results["a convolution's sizes"] == results["its sizes among the keywords"]
    assert results["operands in a list"] == results["operands in a list among the keywords"] == ["NotImplemented"]
    assert results["an error"] == ["ValueError('refused')"]
    assert ours["an error"][2] > 0 and ours["an error"][3] == 0      # lent, then given back
    assert all(outcome[4] for outcome in ours.values())


@needs_compiled
def test_the_compiled_one_frame_path_takes_a_convolution_whole():
    """Its sizes (``stride=(2, 2)``) are values: the compiled path computes the call itself. A
    list holding tensors (einsum's operands) goes to the Python twin."""
    from cudashim import _speedups
    from cudashim.patches.precision import _SCRATCH, WideningCache, _at_once, _at_once_for
    handed = []

    def python_twin(*call):
        handed.append(call)
        return _at_once(*call)
    compiled = _at_once_for(_speedups, python=python_twin)
    calls, kept = _at_once_calls()
    cache = WideningCache()
    for parameter in kept:
        cache.widen(parameter, torch.bfloat16)
    _SCRATCH.clear()
    taken = {}
    with torch.no_grad():
        for what, function, operands, keywords in calls:
            handed.clear()
            try:
                compiled(function, torch.bfloat16, cache, operands, keywords)
            except ValueError:
                pass
            taken[what] = not handed
    assert taken["a layer's projection"] and taken["a convolution's sizes"]
    assert taken["its sizes among the keywords"]
    assert not taken["operands in a list"] and not taken["operands in a list among the keywords"]
    assert not taken["a parameter with no kept copy"]
