"""Precision requests at the target's speed: the policy, autocast, explicit float16, TF32."""

import json

import pytest
import torch
import torch.nn.functional as F

from conftest import explained_and_compiled, python

pytestmark = pytest.mark.host          # the precision policy follows the host's dtype speeds

HALF, BF16 = torch.float16, torch.bfloat16
SLOW_BOTH = {HALF: False, BF16: False}          # this machine's kind: AVX2, no BF16/FP16 units
FAST_BF16 = {HALF: False, BF16: True}           # AVX512_BF16 or AMX without FP16
FAST_BOTH = {HALF: True, BF16: True}            # an accelerator
# oneDNN's float32 precision setting, what the TF32 flags map to (torch 2.9 and later)
ONEDNN_PRECISION = hasattr(getattr(torch.backends.mkldnn, "matmul", None), "fp32_precision")
needs_onednn_precision = pytest.mark.skipif(not ONEDNN_PRECISION,
                                            reason="this torch has no torch.backends.mkldnn.matmul.fp32_precision")


def _policy(fast, amp_dtype="auto", tf32="auto", device_type="cpu"):
    from cudashim.precision import PrecisionPolicy
    return PrecisionPolicy(amp_dtype, tf32, device_type, fast, "test")


@pytest.mark.parametrize("fast, setting, asked, expected", [
    (FAST_BF16, "auto", HALF, BF16),             # float16 is slow, bfloat16 fast
    (SLOW_BOTH, "auto", HALF, None),             # both slow: float32
    (SLOW_BOTH, "auto", BF16, None),
    (FAST_BOTH, "auto", HALF, HALF),             # fast float16: nothing changes
    ({HALF: True, BF16: False}, "auto", BF16, None),   # never bfloat16 -> float16 (range)
    (SLOW_BOTH, "as-asked", HALF, HALF),
    (SLOW_BOTH, "bfloat16", HALF, BF16),
    (FAST_BOTH, "float16", BF16, HALF),
])
def test_the_policy_picks_the_dtype_an_autocast_region_runs_in(fast, setting, asked, expected):
    assert _policy(fast, setting).autocast_dtype(asked) == expected


def test_a_slow_float16_region_runs_in_the_compute_bound_choice_of_the_matmul_family():
    """Measured: where the host's training-sized float16 matmuls are fastest in bfloat16, a
    float16 region runs in bfloat16; where in float32, autocast is off; a bfloat16 choice is
    never taken where bfloat16 is slow."""
    from cudashim.precision import BFLOAT16, FLOAT32, AS_ASKED, MatmulChoices, PrecisionPolicy

    def region(fast, memory, compute):
        choices = MatmulChoices(memory, compute, 4, "test")
        return PrecisionPolicy("auto", "auto", "cpu", fast, "test",
                               measure_matmuls=lambda: choices).autocast_dtype(HALF)
    assert region(FAST_BF16, AS_ASKED, BFLOAT16) == BF16
    assert region(FAST_BF16, AS_ASKED, FLOAT32) is None
    assert region(SLOW_BOTH, AS_ASKED, FLOAT32) is None
    assert region(SLOW_BOTH, BFLOAT16, BFLOAT16) is None       # measured, but bfloat16 is slow
    assert region(SLOW_BOTH, FLOAT32, AS_ASKED) == HALF


@pytest.mark.parametrize("rows, expected", [(1, 4), (4, 4), (5, 1000), (None, 1000)])
def test_the_shape_class_of_a_product_is_told_by_its_rows(rows, expected):
    from cudashim.precision import MatmulChoices
    assert MatmulChoices(4, 1000, 4, "test").for_rows(rows) == expected


def test_the_policy_widens_float16_only_where_it_is_slow_and_not_asked_for():
    assert _policy(SLOW_BOTH).widens_float16 and _policy(FAST_BF16, "bfloat16").widens_float16
    assert not _policy(FAST_BOTH).widens_float16
    assert not _policy(SLOW_BOTH, "as-asked").widens_float16
    assert not _policy(SLOW_BOTH, "float16").widens_float16
    assert _policy(FAST_BF16).float32_matmul_precision == ("bf16" if ONEDNN_PRECISION else None)
    assert _policy(SLOW_BOTH).float32_matmul_precision is None
    assert _policy(FAST_BF16, tf32="ignore").float32_matmul_precision is None
    assert _policy(FAST_BOTH, device_type="xpu").float32_matmul_precision is None


def test_the_cpu_speed_comes_from_the_instruction_set_on_x86():
    import platform

    from cudashim.backends import cpu_speed
    if platform.machine().lower() not in ("x86_64", "amd64"):
        pytest.skip("x86 only")
    if not hasattr(torch.cpu, "_is_avx512_bf16_supported"):
        pytest.skip("this torch has no CPU probes (the next test covers the answer without them)")
    fast, how = cpu_speed.speeds()
    assert how.startswith("from the CPU's instruction set")
    bf16 = torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
    assert fast[BF16] == bf16
    amx_fp16 = getattr(torch.cpu, "_is_amx_fp16_supported", lambda: False)()
    assert fast[HALF] == amx_fp16


def test_a_torch_without_the_cpu_probes_is_answered_by_the_cpus_flags(monkeypatch):
    """torch 2.5 has no torch.cpu._is_amx_fp16_supported: activation must not die on it. The
    flags stand in for each probe, here given the flags of a CPU with AMX (bfloat16, not float16)."""
    from cudashim.backends import cpu_speed
    for probe in cpu_speed._PROBES.values():
        monkeypatch.delattr(torch.cpu, probe, raising=False)
    monkeypatch.setattr(cpu_speed, "_cpu_flags", lambda: "flags\t: fpu avx2 amx_tile amx_bf16")
    assert cpu_speed._from_instruction_set() == FAST_BF16
    monkeypatch.setattr(cpu_speed, "_cpu_flags", lambda: "flags\t: fpu avx2 amx_tile amx_bf16 amx_fp16")
    assert cpu_speed._from_instruction_set() == FAST_BOTH


def test_avx512_fp16_without_amx_fp16_leaves_float16_to_the_measured_choices(monkeypatch):
    """A Xeon with AVX512-FP16 and AMX-BF16 computes float16 products at float32's speed and a
    third of bfloat16's: float16 is not fast there, and doctor's reason says why."""
    from cudashim.backends import cpu_speed
    for probe in cpu_speed._PROBES.values():
        monkeypatch.delattr(torch.cpu, probe, raising=False)
    monkeypatch.setattr(cpu_speed.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(cpu_speed, "_cpu_flags", lambda: "flags\t: fpu avx2 avx512_bf16 avx512_fp16 amx_tile amx_bf16")
    cpu_speed.speeds.cache_clear()
    try:
        fast, how = cpu_speed.speeds()
    finally:
        cpu_speed.speeds.cache_clear()
    assert fast == FAST_BF16
    assert how == "from the CPU's instruction set: AVX512-FP16 without AMX-FP16 computes float16 " \
                  "products at float32's speed"
    assert _policy(fast).widens_float16 and _policy(fast).autocast_dtype(HALF) is BF16


@pytest.mark.parametrize("float32, float16, bfloat16, expected", [
    (1.0, 0.9, 3.0, {"float16": True, "bfloat16": False}),      # FP16 arithmetic, bfloat16 emulated
    (1.0, 1.0, 0.3, {"float16": False, "bfloat16": True}),      # a faster bfloat16 beside float16
    (1.0, 0.4, 0.4, {"float16": True, "bfloat16": True}),
    (1.0, 20.0, 20.0, {"float16": False, "bfloat16": False}),
])
def test_the_calibration_holds_float16_against_float32_and_bfloat16(float32, float16, bfloat16, expected):
    from cudashim.backends import cpu_speed

    class Stopwatch:
        def best_of_turns(self, *calls, turns=None):
            assert len(calls) == 3
            return float32, float16, bfloat16
    assert cpu_speed._measure(Stopwatch()) == expected


def test_elsewhere_a_calibration_runs_once_and_is_cached(monkeypatch, tmp_path, cpu_of_its_own):
    from cudashim.backends import cpu_speed
    monkeypatch.setattr(cpu_speed.platform, "machine", lambda: "aarch64")
    monkeypatch.delenv("CUDASHIM_CACHE_DIR", raising=False)      # the suite keeps its own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    measured = []
    real_measure = cpu_speed._measure
    monkeypatch.setattr(cpu_speed, "_measure", lambda stopwatch: measured.append(1) or real_measure(stopwatch))
    cpu_speed.speeds.cache_clear()
    fast, how = cpu_speed.speeds()
    assert measured == [1] and "calibrated" in how and set(fast) == {HALF, BF16}
    cached = json.loads((tmp_path / "cudashim" / "cpu-dtype-speed.json").read_text())
    assert list(cached.values()) == [{"float16": fast[HALF], "bfloat16": fast[BF16]}]
    cpu_speed.speeds.cache_clear()                        # a new process: read, not measured
    assert cpu_speed.speeds()[0] == fast and measured == [1]


def test_a_table_timed_while_other_work_held_the_cpu_is_provisional_until_a_program_starts_on_a_free_one(
        monkeypatch, tmp_path, caplog):
    """Every turn's threads waited for a CPU: the choices are kept as provisional, the programs
    after it read them while the CPU is still shared (not timing them again beside the same
    load), and the first that starts on a free CPU times them again and keeps them for good.
    What the doctor shows says which."""
    import logging

    from cudashim.backends import cpu_speed, timing
    kept = tmp_path / "kept" / "float16-matmuls.json"
    monkeypatch.setenv("CUDASHIM_CACHE_DIR", str(kept.parent))
    monkeypatch.setattr(cpu_speed, "speeds", lambda profile: (SLOW_BOTH, "a CPU that emulates float16"))
    measured = []
    real_measure = cpu_speed._measure_matmuls
    monkeypatch.setattr(cpu_speed, "_measure_matmuls", lambda stopwatch: measured.append(1) or real_measure(stopwatch))

    def new_process():
        cpu_speed.matmul_choices.cache_clear()
        cpu_speed._cpu_free_now.cache_clear()
        return cpu_speed.matmul_choices()

    waited = iter(range(0, 10 ** 15, 10 ** 9))                # a second's wait at every read
    monkeypatch.setattr(timing, "waited_ns", lambda: next(waited))
    with caplog.at_level(logging.INFO, logger=cpu_speed.__name__):
        timed_busy = new_process()
    assert measured == [1] and "provisional in" in timed_busy.how_known
    assert "other work held this CPU" in caplog.text
    assert [key.endswith(cpu_speed.PROVISIONAL) for key in json.loads(kept.read_text())] == [True]
    for _ in range(2):                                       # the CPU still shared: read, not timed
        read = new_process()
        assert measured == [1] and "provisional in" in read.how_known
        assert read.memory_bound == timed_busy.memory_bound and read.compute_bound == timed_busy.compute_bound

    monkeypatch.setattr(timing, "waited_ns", lambda: 0)      # a program that starts on a free CPU
    timed_free = new_process()
    assert measured == [1, 1] and f"cached in {kept}" in timed_free.how_known
    assert [key.endswith(cpu_speed.PROVISIONAL) for key in json.loads(kept.read_text())] == [False]
    monkeypatch.setattr(timing, "waited_ns", lambda: next(waited))   # kept for good, busy or not
    assert new_process().memory_bound == timed_free.memory_bound and measured == [1, 1]


def test_a_free_cpu_is_told_from_one_other_work_holds(monkeypatch):
    """The probe a program makes once before it reads a provisional answer: a CPU is free where
    the process's threads did not wait for it, and where the system does not say."""
    from cudashim.backends import timing
    monkeypatch.setattr(timing, "waited_ns", lambda: 0)
    assert timing.cpu_is_free(0.001)
    waited = iter(range(0, 10 ** 15, 10 ** 9))
    monkeypatch.setattr(timing, "waited_ns", lambda: next(waited))
    assert not timing.cpu_is_free(0.001)
    monkeypatch.setattr(timing, "waited_ns", lambda: None)
    assert timing.cpu_is_free(0.001)


def test_a_table_is_timed_again_for_other_kernels_of_torchs(monkeypatch, tmp_path):
    """The same CPU with torch's kernels pinned narrower (ATEN_CPU_CAPABILITY=avx2 where AVX-512
    is there) computes float16 at another speed: the table kept for one is not read for the other."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, BFLOAT16
    monkeypatch.setenv("CUDASHIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_speed, "speeds", lambda profile: (FAST_BF16, "test"))
    tables = {"AVX512": (AS_ASKED, BFLOAT16), "AVX2": (AS_ASKED, AS_ASKED)}
    kernels = ["AVX512"]
    monkeypatch.setattr(cpu_speed, "_kernels", lambda: kernels[0])

    def measured(stopwatch):
        memory_bound, compute_bound = tables[kernels[0]]
        return {"memory_bound": memory_bound, "compute_bound": compute_bound, "memory_bound_rows": 2,
                "timings": {}}
    monkeypatch.setattr(cpu_speed, "_measure_matmuls", measured)
    read = []
    for kernels[0] in ("AVX512", "AVX2", "AVX512"):        # the last one read from the cache
        cpu_speed.matmul_choices.cache_clear()
        read.append(cpu_speed.matmul_choices().compute_bound)
    assert read == [BFLOAT16, AS_ASKED, BFLOAT16]
    assert len(json.loads((tmp_path / "float16-matmuls.json").read_text())) == 2


@pytest.fixture
def cpu_of_its_own(monkeypatch):
    """The measurements see a CPU no other work shares (the suite's other worker may be busy on
    it): what they time is kept."""
    from cudashim.backends import timing
    monkeypatch.setattr(timing, "waited_ns", lambda: 0)


class TimedAs:
    """A stopwatch whose turns answer what a test says, on a CPU of its own."""
    contended = False

    def __init__(self, best_of_turns):
        self.best_of_turns = best_of_turns


@pytest.fixture
def speeds(monkeypatch):
    """Activate on the CPU backend with the dtype speeds a test names."""
    import cudashim
    from cudashim.backends import cpu_speed

    def activate(fast, matmuls=None, ops=None, **options):
        """``matmuls``: the float16 matmul choices the host would measure (default: one
        choice for both shape classes, from ``fast``); ``ops``: what it would time for the
        other float16 ops (default: none timed, every op as asked)."""
        from cudashim.precision import MatmulChoices
        chosen = matmuls or MatmulChoices.from_dtype_speeds(fast, "test")
        monkeypatch.setattr(cpu_speed, "speeds", lambda profile: (fast, "test"))
        monkeypatch.setattr(cpu_speed, "matmul_choices", lambda profile: chosen)
        monkeypatch.setattr(cpu_speed, "op_choices", lambda profile: dict(ops or {}))
        cudashim.activate("cpu", **options)
        return cudashim
    yield activate
    cudashim.deactivate()


@pytest.mark.parametrize("fast, options, expected", [
    (FAST_BF16, {}, BF16),
    (SLOW_BOTH, {}, torch.float32),
    (FAST_BOTH, {}, HALF),
    (SLOW_BOTH, {"amp_dtype": "as-asked"}, HALF),
])
def test_cuda_autocast_runs_in_the_policy_dtype(speeds, fast, options, expected):
    speeds(fast, **options)
    a = torch.randn(4, 4, device="cuda")
    for region in (torch.autocast("cuda", dtype=torch.float16), torch.cuda.amp.autocast(),
                   torch.amp.autocast("cuda")):
        with region:
            assert (a @ a).dtype == expected
            assert torch.is_autocast_enabled("cuda") == (expected != torch.float32)


@pytest.mark.parametrize("fast, expected", [(FAST_BF16, BF16), (SLOW_BOTH, torch.float32),
                                             (FAST_BOTH, HALF)])
def test_autocast_on_the_targets_own_device_type_gets_the_cuda_policy(speeds, fast, expected):
    """timm derives autocast's device type from its tensors: under the shim that names the
    target, and the region gets the policy a "cuda" one gets; its default dtype is the
    target's own (bfloat16 on the CPU)."""
    speeds(fast)
    a = torch.randn(4, 4, device="cuda")
    with torch.autocast(device_type=a.device.type, dtype=torch.float16):
        assert (a @ a).dtype == expected
    with torch.autocast("cuda", dtype=torch.float16):
        assert (a @ a).dtype == expected
    with torch.autocast(a.device.type):
        assert (a @ a).dtype == (BF16 if fast[BF16] else torch.float32)


@pytest.mark.parametrize("fast, runs_in, warned", [(SLOW_BOTH, torch.float32, False),
                                                  (FAST_BOTH, HALF, True)])
def test_a_dtype_the_target_cannot_autocast_to_is_named_only_where_the_region_autocasts(
        speeds, monkeypatch, fast, runs_in, warned):
    """A target that autocasts to float16 only, asked for bfloat16: where the policy turns the
    region off it runs in float32 and no warning promises float16 (torchvulkan's case)."""
    import warnings
    from cudashim.backends.cpu import CPUBackend
    monkeypatch.setattr(CPUBackend, "autocast_dtypes", lambda self: (HALF,))
    speeds(fast)
    a = torch.randn(4, 4, device="cuda")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cuda", dtype=BF16):
            assert (a @ a).dtype == runs_in
    said = [str(w.message) for w in caught if "cannot autocast to torch.bfloat16" in str(w.message)]
    assert bool(said) == warned, said


@pytest.mark.parametrize("fast", [FAST_BF16, SLOW_BOTH])
def test_grad_scaler_still_scales_and_skips_steps_on_inf(speeds, fast):
    speeds(fast)
    model = torch.nn.Linear(4, 1).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.cuda.amp.GradScaler(init_scale=256.0)

    def step(poison):
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(torch.randn(8, 4, device="cuda")).float().pow(2).mean()
        scaler.scale(loss).backward()
        if poison:
            model.weight.grad[0, 0] = float("inf")
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()

    before = model.weight.detach().clone()
    step(poison=True)
    assert torch.equal(before, model.weight) and scaler.get_scale() == 128.0   # skipped, backed off
    step(poison=False)
    assert not torch.equal(before, model.weight) and scaler.get_scale() == 128.0


def _family(x, w, m3):
    """(the API as the report names it, call) for the matmul family."""
    q = m3[:, :4, :8].contiguous()
    image = x[:16].reshape(1, 1, 16, 64)
    return [
        ("torch.mm", lambda: torch.mm(x, w.t())),
        ("Tensor.mm", lambda: x.mm(w.t())),
        ("Tensor.__matmul__", lambda: x @ w.t()),
        ("torch.matmul", lambda: torch.matmul(x, w.t())),
        ("torch.bmm", lambda: torch.bmm(m3, m3.transpose(1, 2))),
        ("torch.addmm", lambda: torch.addmm(x[:, :16], x, w.t()[:, :16])),
        ("torch.baddbmm", lambda: torch.baddbmm(m3[:, :1].transpose(1, 2), m3.transpose(1, 2), m3)),
        ("torch.addbmm", lambda: torch.addbmm(x[:16, :16], m3, m3.transpose(1, 2))),
        ("Tensor.addbmm", lambda: x[:16, :16].addbmm(m3, m3.transpose(1, 2))),
        ("torch.inner", lambda: torch.inner(x, w)),
        ("Tensor.inner", lambda: x.inner(w)),
        ("torch.tensordot", lambda: torch.tensordot(m3, w, dims=([2], [1]))),
        ("torch.linalg.matmul", lambda: torch.linalg.matmul(x, w.t())),
        ("torch.linalg.multi_dot", lambda: torch.linalg.multi_dot([x, w.t(), w])),
        ("torch.nn.functional.bilinear",
         lambda: F.bilinear(x[:, :16], x[:, 16:32], w.reshape(-1)[:2048].reshape(8, 16, 16), w[0, :8])),
        ("torch.cdist", lambda: torch.cdist(x, w)),
        ("torch.einsum", lambda: torch.einsum("bij,bkj->bik", m3, m3)),
        ("torch.nn.functional.linear", lambda: F.linear(x, w, w[:, 0])),
        ("torch.nn.functional.conv1d", lambda: F.conv1d(x[None], w[:8, :32, None])),
        ("torch.nn.functional.conv2d", lambda: F.conv2d(image, w[:2, :9].reshape(2, 1, 3, 3))),
        ("torch.nn.functional.conv_transpose2d", lambda: F.conv_transpose2d(image, w[:1, :9].reshape(1, 1, 3, 3))),
        ("torch.nn.functional.scaled_dot_product_attention",
         lambda: F.scaled_dot_product_attention(q, q, q)),
    ]


def _half_inputs():
    torch.manual_seed(0)
    return (torch.randn(32, 64).half(), torch.randn(48, 64).half(), torch.randn(3, 16, 64).half())


def test_explicit_float16_stays_float16_and_is_at_least_as_close_as_the_native_kernel(speeds):
    x, w, m3 = _half_inputs()
    native = {name: call() for name, call in _family(x, w, m3)}
    reference = {name: call() for name, call in _family(x.double(), w.double(), m3.double())}
    speeds(SLOW_BOTH, report=True)
    import cudashim.activation as activation
    counted = activation.current_activation().report.entries
    for name, call in _family(x, w, m3):
        ours = call()
        assert ours.dtype == HALF, name
        assert counted[name] == {**counted[name], "calls": 1, "became": "float16 computed in float32"}
        error = (ours.double() - reference[name]).abs().max()
        native_error = (native[name].double() - reference[name]).abs().max()
        assert error <= native_error, (name, error, native_error)


def test_a_float16_product_written_into_a_tensor_is_computed_wide_and_lands_there(speeds):
    """``out=`` and the in-place methods: the tensor the program named holds the result,
    computed in the policy's choice and rounded once, and is what the call returns."""
    x, w, m3 = _half_inputs()
    layer = torch.nn.Linear(64, 48).half().requires_grad_(False)     # its weight may be kept wide
    speeds(SLOW_BOTH, report=True)
    expected = (x.float() @ w.float().t()).half()
    for call in (torch.mm, torch.matmul, torch.linalg.matmul):
        out = torch.empty(32, 48, dtype=HALF)
        assert call(x, w.t(), out=out) is out and torch.equal(out, expected), call
    unsized = torch.empty(0, dtype=HALF)                               # resized silently, as torch does
    assert torch.mm(x, w.t(), out=unsized) is unsized and torch.equal(unsized, expected)
    assert _counted("torch.mm") == "float16 computed in float32"

    layer(x)                                                           # keeps a float32 copy of its weight
    accumulated = x[:, :48].clone()
    assert accumulated.addmm_(x, layer.weight.t(), beta=0.5) is accumulated
    reference = (0.5 * x[:, :48].float() + x.float() @ layer.weight.float().t()).half()
    assert accumulated.dtype == HALF and torch.equal(accumulated, reference)
    assert _counted("Tensor.addmm_") == "float16 computed in float32"
    merged = (layer.weight.float() + w[:, :32].float() @ x.float()).half()
    layer.weight.addmm_(w[:, :32], x)                                 # a delta merged into a kept weight
    assert torch.equal(layer.weight, merged) and torch.equal(layer(x), F.linear(x, merged, layer.bias))
    batches, ones = m3[:, :, :16].clone(), torch.ones(3, 64, 16, dtype=HALF)
    assert batches.baddbmm_(m3, ones) is batches
    assert torch.equal(batches, (m3[:, :, :16].float() + m3.float() @ ones.float()).half())


def test_float16_and_bfloat16_convert_to_each_other_as_torch_converts_them():
    """The policy converts between the two reduced types by way of float32 (torch converts
    directly element by element, several times slower): every one of the 65536 values of
    each type lands where torch's own conversion puts it, and a NaN stays a NaN."""
    from cudashim.patches.precision import converted
    every = torch.arange(-2 ** 15, 2 ** 15, dtype=torch.int32).to(torch.int16)
    for source, target in ((HALF, BF16), (BF16, HALF)):
        values = every.view(source)
        ours, torchs = converted(values, target), values.to(target)
        assert ours.dtype == target
        nan = torchs.isnan()
        assert torch.equal(ours.isnan(), nan), (source, target)
        assert torch.equal(ours[~nan].view(torch.int16), torchs[~nan].view(torch.int16)), (source, target)
    values = every.view(HALF)
    assert converted(values, HALF) is values                          # nothing to convert


def test_a_float16_product_in_bfloat16_written_into_a_tensor_is_rounded_there_once(speeds):
    """Where the policy's choice is bfloat16, ``out=`` and the in-place methods hold the
    bfloat16 product rounded to float16 once, as computed by hand."""
    from cudashim.precision import BFLOAT16, MatmulChoices
    x, w, m3 = _half_inputs()
    speeds(FAST_BF16, matmuls=MatmulChoices(BFLOAT16, BFLOAT16, 4, "test"), report=True)
    expected = (x.bfloat16() @ w.bfloat16().t()).float().half()
    out = torch.empty(32, 48, dtype=HALF)
    assert torch.mm(x, w.t(), out=out) is out and torch.equal(out, expected)
    assert torch.equal(torch.mm(x, w.t()), expected)
    accumulated = x[:, :48].clone()
    assert accumulated.addmm_(x, w.t(), beta=0.5) is accumulated
    reference = x[:, :48].bfloat16().addmm_(x.bfloat16(), w.bfloat16().t(), beta=0.5).float().half()
    assert accumulated.dtype == HALF and torch.equal(accumulated, reference)
    assert _counted("Tensor.addmm_") == "float16 computed in bfloat16"


def _bfloat16_products(speeds):
    from cudashim.precision import BFLOAT16, MatmulChoices
    speeds(FAST_BF16, matmuls=MatmulChoices(BFLOAT16, BFLOAT16, 4, "test"), report=True)


def _kept_copies():
    """The activation's cache of widened weights, found through what deactivation undoes (it
    exists since activation, which froze it out of ``gc.get_objects()``)."""
    import cudashim
    from cudashim.patches.precision import WideningCache
    activation = cudashim.activation.current_activation()
    [cache] = [patch.undo.__self__ for patch in activation.registry
               if patch.name == "float16 weights kept in float32"]
    assert isinstance(cache, WideningCache)
    return cache


def _by_hand_in_bfloat16(call, *tensors):
    return call(*(t.float().bfloat16() for t in tensors)).float().half()


def test_inference_in_bfloat16_reuses_its_conversion_buffers_without_touching_earlier_results(speeds):
    """Under no_grad the operands are converted into kept buffers and the result rounded where
    it lies: each result is its own float16 tensor, and stays what it was while later calls
    of the same sizes reuse the buffers."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(8, 16, 3, padding=1, bias=False).half().eval()
    batches = [torch.randn(4, 8, 16, 16).half() for _ in range(4)]
    expected = [_by_hand_in_bfloat16(lambda x, w: F.conv2d(x, w, padding=1), x, conv.weight) for x in batches]
    channels_last = batches[0].contiguous(memory_format=torch.channels_last)
    strided = torch.cat([batches[1], batches[0]], dim=1)[:, 8:]      # neither layout: staged
    _bfloat16_products(speeds)
    with torch.no_grad():
        results = [conv(x) for x in batches]
        after_channels_last, after_strided = conv(channels_last), conv(strided)
    for result, reference in zip(results, expected):
        assert result.dtype == HALF and result._base is None and torch.equal(result, reference)
    assert len({r.untyped_storage().data_ptr() for r in results}) == len(results)
    assert torch.equal(after_channels_last, expected[0]) and torch.equal(after_strided, expected[0])
    assert _counted("torch.nn.functional.conv2d") == "float16 computed in bfloat16"
    from cudashim.patches.precision import _SCRATCH
    assert 0 < _SCRATCH.held <= _SCRATCH.budget                     # kept for the next call


def test_heads_split_off_a_fused_projection_give_attention_laid_out_as_torchs_own(speeds):
    """q, k and v split off one fused projection and turned to (batch, head, position), as GPT
    and Llama code splits them, are neither dense nor row-major. Computed in bfloat16, the
    attention is what the same call on bfloat16 copies gives, laid out as torch's own float16
    call lays it out (batch, position, head: the program's ``transpose(1, 2)`` then needs no
    copy), and rounded to float16 where it lies, no view of a buffer."""
    torch.manual_seed(0)
    qkv = torch.randn(2, 16, 3 * 64).half()
    q, k, v = (t.view(2, 16, 4, 16).transpose(1, 2) for t in qkv.split(64, dim=2))
    attention = lambda *t: F.scaled_dot_product_attention(*t, is_causal=True)   # noqa: E731
    torchs = attention(q, k, v)
    expected = _by_hand_in_bfloat16(attention, q, k, v)
    _bfloat16_products(speeds)
    with torch.no_grad():
        ours = attention(q, k, v)
        again = attention(q, k, v)                  # from the kept buffers
    assert torchs.stride() != q.contiguous().stride()          # what the layout test can tell
    for result in (ours, again):
        assert result.dtype == HALF and result.stride() == torchs.stride() and result._base is None
        assert torch.equal(result, expected)
    assert ours.untyped_storage().data_ptr() != again.untyped_storage().data_ptr()
    assert _counted("torch.nn.functional.scaled_dot_product_attention") == "float16 computed in bfloat16"


def test_operands_split_off_one_projection_are_converted_as_it_once_and_views_reaching_past_it_alone(speeds):
    """q, k and v that together are their fused projection are converted as the projection, once:
    the kept buffers then hold one buffer of its size, where each head converted alone is
    staged first. Views whose elements reach past their base (an ``as_strided`` over the
    storage) or overlap are converted one by one. Every result is what the same call on
    bfloat16 copies gives."""
    from cudashim.patches.precision import _SCRATCH
    torch.manual_seed(0)
    fused = torch.randn(2, 16, 3 * 64).half()
    heads = [t.view(2, 16, 4, 16).transpose(1, 2) for t in fused.split(64, dim=2)]
    # A projection laid over the middle of a larger storage, and three views of it as large as
    # it, the first of which starts before it.
    memory = torch.randn(4 * fused.numel()).half().untyped_storage()
    laid = torch.empty(0, dtype=HALF).set_(memory, fused.numel(), fused.size())
    past = [laid.as_strided((2, 4, 16, 16), (3072, 16, 192, 1), 0),
            *(t.view(2, 16, 4, 16).transpose(1, 2) for t in laid.split(64, dim=2)[1:])]
    assert all(view._base is laid for view in past)
    overlapping = [heads[0], heads[0], heads[2]]
    attention = lambda *t: F.scaled_dot_product_attention(*t, is_causal=True)   # noqa: E731
    expected = [_by_hand_in_bfloat16(attention, *operands) for operands in (heads, past, overlapping)]
    torchs = [attention(*operands).stride() for operands in (heads, past, overlapping)]
    _bfloat16_products(speeds)
    with torch.no_grad():
        _SCRATCH.clear()
        together = attention(*heads)
        kept = {nbytes: list(buffers) for nbytes, buffers in _SCRATCH.free.items()}
        results = [together, attention(*past), attention(*overlapping)]
    assert list(kept) == [fused.numel() * 2] and len(kept[fused.numel() * 2]) == 1
    for result, reference, strides in zip(results, expected, torchs):
        assert result.dtype == HALF and torch.equal(result, reference) and result.stride() == strides


@pytest.mark.parametrize("computed_in", ["bfloat16", "bfloat16, torch converting", "float32"])
def test_a_layer_called_again_uses_its_kept_copy_only_while_the_weight_is_unchanged(speeds, computed_in):
    """The second call of a layer under no_grad takes the kept copy of its weight (the policy's
    one-frame path): its result is the first's, in memory of its own. A weight written in place,
    given another storage, or written through ``.data`` is converted again at the next call.
    So in bfloat16, with the compiled conversion or torch's, and in float32."""
    import contextlib
    from cudashim.kernels import native
    from cudashim.precision import FLOAT32, MatmulChoices
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32).half().eval()
    x = torch.randn(4, 16, 64).half()
    if computed_in == "float32":
        by_hand = lambda: F.linear(x.float(), layer.weight.float(), layer.bias.float()).half()   # noqa: E731
        speeds(SLOW_BOTH, matmuls=MatmulChoices(FLOAT32, FLOAT32, 4, "test"), report=True)
    else:
        by_hand = lambda: _by_hand_in_bfloat16(F.linear, x, layer.weight, layer.bias)   # noqa: E731
        _bfloat16_products(speeds)
    converting = native.portable_only() if "torch" in computed_in else contextlib.nullcontext()
    with torch.no_grad(), converting:
        first, second = layer(x), layer(x)
        assert torch.equal(first, by_hand()) and torch.equal(second, first)
        assert second.dtype == HALF and second._base is None
        assert first.untyped_storage().data_ptr() != second.untyped_storage().data_ptr()
        layer.weight.mul_(2)                                      # its version moves
        assert torch.equal(layer(x), by_hand()) and not torch.equal(layer(x), first)
        layer.weight.set_(torch.randn(32, 64).half())             # another storage
        assert torch.equal(layer(x), by_hand())
        layer.weight.data.copy_(torch.randn(32, 64).half())       # no version moves
        assert torch.equal(layer(x), by_hand())
    assert _counted("torch.nn.functional.linear") == f"float16 computed in {computed_in.split(',')[0]}"


def _packing_counted(monkeypatch):
    """Counts of the policy's calls into ``kernels.packed_linear`` (weights packed, products on
    packed weights), and where each product's bfloat16 result lies (``counts.results_at``). Skips
    where packing does not run here, saying why."""
    from cudashim.kernels import packed_linear
    reason = packed_linear.unavailable()
    if reason is not None:
        pytest.skip(reason)
    counts = _Counts(packed=0, computed=0)
    pack, linear = packed_linear.pack, packed_linear.linear

    def packing(weight):
        counts["packed"] += 1
        return pack(weight)

    def computing(*args):
        counts["computed"] += 1
        result = linear(*args)
        counts.results_at.append(result.data_ptr())
        return result
    monkeypatch.setattr(packed_linear, "pack", packing)
    monkeypatch.setattr(packed_linear, "linear", computing)
    return counts


class _Counts(dict):
    results_at: list

    def __init__(self, **counts):
        super().__init__(**counts)
        self.results_at = []


def test_a_linear_layer_in_bfloat16_packs_its_kept_weight_once_and_holds_no_plain_copy(speeds, monkeypatch):
    """Under no_grad a float16 linear layer computed in bfloat16 reads its weight packed for
    oneDNN: packed at the first call and kept, in place of the plain bfloat16 copy, and packed
    again only once the weight has changed. Each result is torch's bfloat16 linear rounded to
    float16, in memory of its own; the compiled path and its Python twin take the same calls."""
    from cudashim.kernels import native
    from cudashim.patches import precision
    counts = _packing_counted(monkeypatch)
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32).half().eval()
    x = torch.randn(4, 16, 64).half()
    by_hand = lambda: _by_hand_in_bfloat16(F.linear, x, layer.weight, layer.bias)   # noqa: E731
    _bfloat16_products(speeds)
    with torch.no_grad():
        results = [layer(x) for _ in range(3)]
        assert counts == {"packed": 1, "computed": 3}
        for result in results:
            assert result.dtype == HALF and torch.equal(result, by_hand()) and result._base is None
        if native.usable():           # each rounded where its product lay: no second buffer
            assert [result.data_ptr() for result in results] == counts.results_at
        assert len({result.data_ptr() for result in results}) == 3
        cache = _kept_copies()
        weight_key, bias_key = (id(layer.weight), BF16), (id(layer.bias), BF16)
        assert cache.packed.copies[weight_key][3].is_mkldnn and weight_key not in cache.copies
        assert cache.packed.copies[bias_key][3].dtype == BF16     # the bias: a plain copy
        twins = precision._at_once(precision._PACKED_FORMS[F, "linear"].computed, BF16, cache.packed,
                                   (x, layer.weight, layer.bias), {})   # the compiled path's twin
        assert torch.equal(twins, results[0]) and counts["packed"] == 1
        if native.usable():
            assert twins.data_ptr() == counts.results_at[-1]
        layer.weight.mul_(2)                                      # its version moves
        assert torch.equal(layer(x), by_hand()) and counts["packed"] == 2
        assert F.linear(x, layer.weight, bias=layer.bias).dtype == HALF    # a keyword: Python's path
        assert counts == {"packed": 2, "computed": 6}
    assert _counted("torch.nn.functional.linear") == "float16 computed in bfloat16"


def test_a_conv1d_layer_of_gpt2_packs_its_weight_laid_out_in_by_out(speeds, monkeypatch):
    """Hugging Face's Conv1D (GPT-2's layers) computes ``torch.addmm(bias, x, weight)`` with its
    weight laid out in x out: packed as its transpose, apart from a linear layer's, once. A
    scaled addmm, or one adding a matrix, is torch's own in bfloat16."""
    counts = _packing_counted(monkeypatch)
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(64, 96).half() / 8, requires_grad=False)    # in x out
    bias = torch.nn.Parameter(torch.randn(96).half(), requires_grad=False)
    x = torch.randn(2, 64).half()
    expected = _by_hand_in_bfloat16(torch.addmm, bias, x, weight)
    _bfloat16_products(speeds)
    with torch.no_grad():
        for _ in range(3):
            assert torch.equal(torch.addmm(bias, x, weight), expected)
        assert counts == {"packed": 1, "computed": 3}
        scaled = torch.addmm(bias, x, weight, beta=0.5, alpha=2)
        matrix = torch.addmm(bias.expand(2, 96), x, weight)
    assert torch.equal(scaled, _by_hand_in_bfloat16(lambda b, m, w: torch.addmm(b, m, w, beta=0.5, alpha=2),
                                                    bias, x, weight))
    assert torch.equal(matrix, expected) and counts == {"packed": 1, "computed": 3}
    assert _counted("torch.addmm (memory-bound)") == "float16 computed in bfloat16"


def _convolutions_counted(monkeypatch, transposed=False):
    """Counts of the policy's calls into ``kernels.packed_convolution``: weights packed (with the
    arguments each was packed for), convolutions computed (``transposed``: transposed ones).
    Skips where packing does not run here, saying why; where linear layers pack and the compiled
    conversions run, convolutions' probes pass (they compute what the policy computes: a wrong
    layout or value turns packing off). The probes run before the counting starts."""
    from cudashim.kernels import native, packed_convolution, packed_linear
    reason = packed_linear.unavailable() or native.why_not_used()
    if reason is not None:
        pytest.skip(reason)
    assert packed_convolution.unavailable() is None
    assert packed_convolution.volumetric_unavailable() is None
    assert packed_convolution.transposed_unavailable() is None
    assert packed_convolution.volumetric_transposed_unavailable() is None
    counts = _Counts(packed=0, computed=0)
    pack_name, convolution_name = ("pack_transposed", "convolution_transposed") if transposed \
        else ("pack", "convolution")
    pack, convolution = getattr(packed_convolution, pack_name), getattr(packed_convolution, convolution_name)
    arguments_kept = 5 if transposed else 4

    def packing(weight, *arguments):
        counts["packed"] += 1
        counts.results_at.append(arguments[:arguments_kept])
        return pack(weight, *arguments)

    def computing(*args, **kwargs):
        counts["computed"] += 1
        return convolution(*args, **kwargs)
    monkeypatch.setattr(packed_convolution, pack_name, packing)
    monkeypatch.setattr(packed_convolution, convolution_name, computing)
    _packed_timed_faster(monkeypatch)
    return counts


def _packed_timed_faster(monkeypatch, packed_ms=1.0, plain_ms=2.0):
    """Each kind of convolution timed at its first call as running in ``packed_ms`` on its packed
    weight and ``plain_ms`` as torch's own on plain copies, the forms not called again to be timed.
    Returns the kinds timed, in order."""
    from cudashim.patches import precision
    timed = []

    def stopwatch():
        timed.append(None)
        return TimedAs(lambda *calls, turns: [packed_ms, plain_ms])
    monkeypatch.setattr(precision._PACKED_OR_PLAIN, "stopwatch", stopwatch)
    return timed


def _layer_in_bfloat16(layer, x):
    """What a bfloat16 port of ``layer`` computes on ``x``, rounded to float16."""
    import copy
    with torch.no_grad():
        return copy.deepcopy(layer).bfloat16()(x.float().bfloat16()).float().half()


def _close_to_bfloat16s(result, by_hand):
    """``result`` is the float16 rounding of a bfloat16 convolution's: ``by_hand``'s values, where
    another of oneDNN's kernels may have summed in another order, in the same layout."""
    torch.testing.assert_close(result.float(), by_hand.float(), rtol=2 ** -7, atol=2 ** -6)
    assert result.dtype == HALF and result.stride() == by_hand.stride() and result._base is None


def _each_layer_twice_as_by_hand(layers, inputs, by_hand):
    """Each of ``layers`` called twice on its input gives the float16 rounding of its bfloat16 port's
    result (``by_hand``), laid out alike."""
    for name, layer in layers.items():
        for _ in range(2):
            _close_to_bfloat16s(layer(inputs[name]), by_hand[name])


def test_a_conv2d_layer_in_bfloat16_packs_its_weight_once_and_lays_out_its_result_as_cuda_does(speeds, monkeypatch):
    """Under no_grad a float16 conv2d computed in bfloat16 reads its weight packed for oneDNN's
    channels-last kernels: packed at the first call and kept, in place of a plain copy, and
    packed again once the weight changes or a call gives other sizes. Its result is laid out as
    CUDA lays it out, channels-last where the input or the weight is, else channel-first, and
    holds torch's bfloat16 convolution rounded to float16, for the forms nn.Conv2d calls
    (stride, padding "same" and "valid", dilation, groups, a padding mode, keywords)."""
    counts = _convolutions_counted(monkeypatch)
    torch.manual_seed(0)
    layers = {"plain": torch.nn.Conv2d(6, 8, 3, padding=1),
              "strided, grouped": torch.nn.Conv2d(6, 8, 3, stride=2, groups=2, bias=False),
              "same, dilated": torch.nn.Conv2d(6, 8, 3, padding="same", dilation=2),
              "valid, reflected": torch.nn.Conv2d(6, 8, (3, 5), padding=(1, 2), padding_mode="reflect")}
    layers = {name: layer.half().eval() for name, layer in layers.items()}
    x = torch.randn(2, 6, 11, 9).half()
    channels_last = x.contiguous(memory_format=torch.channels_last)
    by_hand = {name: _layer_in_bfloat16(layer, x) for name, layer in layers.items()}
    by_hand_last = _layer_in_bfloat16(layers["plain"], channels_last)
    _bfloat16_products(speeds)
    with torch.no_grad():
        _each_layer_twice_as_by_hand(layers, dict.fromkeys(layers, x), by_hand)
        assert counts == {"packed": 4, "computed": 8}
        plain = layers["plain"]
        ours = plain(channels_last)                          # an input laid out channels-last
        assert ours.is_contiguous(memory_format=torch.channels_last) and not ours.is_contiguous()
        _close_to_bfloat16s(ours, by_hand_last)
        keyword = F.conv2d(x, plain.weight, bias=plain.bias, padding=1)
        _close_to_bfloat16s(keyword, by_hand["plain"])
        assert counts == {"packed": 4, "computed": 10}
        cache = _kept_copies()
        key = (id(plain.weight), BF16)
        assert cache.packed_convolutions.copies[key][3].is_mkldnn and key not in cache.copies
        strided = F.conv2d(x, plain.weight, plain.bias, 2, 1)   # the same weight, another stride
        _close_to_bfloat16s(strided, _by_hand_in_bfloat16(lambda *t: F.conv2d(*t, 2, 1), x, plain.weight, plain.bias))
        assert counts["packed"] == 5 and counts.results_at[-1] == ([1, 1], [2, 2], [1, 1], 1)
        plain.weight.mul_(2)                                 # its version moves
        _close_to_bfloat16s(plain(x), _layer_in_bfloat16(plain, x))
        assert counts == {"packed": 6, "computed": 12}
        plain.to(memory_format=torch.channels_last)          # a model made channels-last
        ours = plain(x)
        assert ours.is_contiguous(memory_format=torch.channels_last) and counts["packed"] == 7
        _close_to_bfloat16s(ours, _layer_in_bfloat16(plain, x))
    assert counts.results_at[:4] == [([1, 1], [1, 1], [1, 1], 1), ([0, 0], [2, 2], [1, 1], 2),
                                     ([2, 2], [1, 1], [2, 2], 1), ([0, 0], [1, 1], [1, 1], 1)]
    assert _counted("torch.nn.functional.conv2d") == "float16 computed in bfloat16"


def test_a_conv1d_layer_in_bfloat16_packs_its_weight_as_a_conv2d_of_height_one(speeds, monkeypatch):
    """A float16 conv1d computed in bfloat16 (audio front ends: wav2vec2's feature encoder, Whisper's
    two convolutions) is packed as a conv2d of height one: its weight packed once, for its
    arguments, and its result dense and contiguous as cuDNN returns a 1-D convolution's, from a
    contiguous input or one transposed from (batch, position, channel), holding torch's bfloat16
    conv1d rounded to float16. An unbatched input is torch's own."""
    counts = _convolutions_counted(monkeypatch)
    torch.manual_seed(4)
    layers = {"strided, one channel in": torch.nn.Conv1d(1, 8, 10, 5, bias=False),
              "padded": torch.nn.Conv1d(6, 8, 3, padding=1),
              "same, dilated, grouped": torch.nn.Conv1d(6, 8, 3, padding="same", dilation=2, groups=2)}
    layers = {name: layer.half().eval() for name, layer in layers.items()}
    inputs = {"strided, one channel in": torch.randn(2, 1, 57).half(), "padded": torch.randn(2, 6, 13).half(),
              "same, dilated, grouped": torch.randn(2, 13, 6).half().transpose(1, 2)}
    by_hand = {name: _layer_in_bfloat16(layer, inputs[name]).contiguous() for name, layer in layers.items()}
    unbatched = _layer_in_bfloat16(layers["padded"], inputs["padded"][0])
    _bfloat16_products(speeds)
    with torch.no_grad():
        _each_layer_twice_as_by_hand(layers, inputs, by_hand)
        assert counts == {"packed": 3, "computed": 6}
        assert counts.results_at == [([0, 0], [1, 5], [1, 1], 1), ([0, 1], [1, 1], [1, 1], 1),
                                     ([0, 2], [1, 1], [1, 2], 2)]
        assert torch.equal(layers["padded"](inputs["padded"][0]), unbatched)
        assert counts == {"packed": 3, "computed": 6}
    assert _counted("torch.nn.functional.conv1d") == "float16 computed in bfloat16"


def _each_volumetric_layer_packs_once(speeds, counts, layers, x, checked_last):
    """Each of ``layers`` (3-D convolutions, plain or transposed) made float16 and called twice on
    ``x`` under no_grad packs its weight once and holds torch's bfloat16 layer rounded to float16;
    ``checked_last``'s result from ``x`` made channels-last is channels-last, as CUDA lays it out."""
    layers = {name: layer.half().eval() for name, layer in layers.items()}
    channels_last = x.contiguous(memory_format=torch.channels_last_3d)
    by_hand = {name: _layer_in_bfloat16(layer, x) for name, layer in layers.items()}
    by_hand_last = _layer_in_bfloat16(layers[checked_last], channels_last)
    _bfloat16_products(speeds)
    with torch.no_grad():
        _each_layer_twice_as_by_hand(layers, dict.fromkeys(layers, x), by_hand)
        assert counts == {"packed": len(layers), "computed": 2 * len(layers)}
        ours = layers[checked_last](channels_last)
        assert ours.is_contiguous(memory_format=torch.channels_last_3d) and not ours.is_contiguous()
        _close_to_bfloat16s(ours, by_hand_last)
        assert counts == {"packed": len(layers), "computed": 2 * len(layers) + 1}


def test_a_conv3d_layer_in_bfloat16_packs_its_weight_and_lays_out_its_result_as_cuda_does(speeds, monkeypatch):
    """A float16 conv3d computed in bfloat16 (a video model's, a volumetric U-Net's) reads its weight
    packed once for oneDNN's 3-D convolution of its arguments; its result holds torch's bfloat16
    conv3d rounded to float16, channel-first from a channel-first input and channels-last from a
    channels-last one, as CUDA lays it out."""
    counts = _convolutions_counted(monkeypatch)
    torch.manual_seed(6)
    layers = {"padded": torch.nn.Conv3d(4, 8, 3, padding=1),
              "strided, grouped": torch.nn.Conv3d(4, 6, (1, 3, 3), stride=(1, 2, 2), groups=2, bias=False)}
    _each_volumetric_layer_packs_once(speeds, counts, layers, torch.randn(2, 4, 3, 9, 7).half(), "padded")
    assert counts.results_at == [([1, 1, 1], [1, 1, 1], [1, 1, 1], 1), ([0, 0, 0], [1, 2, 2], [1, 1, 1], 2)]
    assert _counted("torch.nn.functional.conv3d") == "float16 computed in bfloat16"


def test_a_conv_transpose2d_layer_in_bfloat16_packs_its_weight_and_lays_out_its_result_as_cuda_does(speeds, monkeypatch):
    """A float16 conv_transpose2d computed in bfloat16 (a DCGAN generator, a U-Net's decoder) reads
    its weight packed once for oneDNN's transposed convolution of its arguments, packed again once
    the weight changes; its result holds torch's bfloat16 conv_transpose2d rounded to float16, laid
    out as CUDA lays it out (channels-last where the input or the weight is), for the forms
    nn.ConvTranspose2d calls (stride, output padding, an output size, groups, dilation) and
    keywords. A gradient recorded through the weight, an unbatched input, and a call torch refuses
    are torch's own."""
    import copy
    counts = _convolutions_counted(monkeypatch, transposed=True)
    torch.manual_seed(5)
    layers = {"upsampling": torch.nn.ConvTranspose2d(6, 8, 4, stride=2, padding=1, bias=False),
              "grouped, dilated": torch.nn.ConvTranspose2d(6, 9, 3, padding=1, groups=3, dilation=2),
              "output padding": torch.nn.ConvTranspose2d(6, 8, 3, stride=2, padding=1, output_padding=1)}
    layers = {name: layer.half().eval() for name, layer in layers.items()}
    x = torch.randn(2, 6, 7, 5).half()
    channels_last = x.contiguous(memory_format=torch.channels_last)
    by_hand = {name: _layer_in_bfloat16(layer, x) for name, layer in layers.items()}
    upsampling = layers["upsampling"]
    sized = _by_hand_in_bfloat16(lambda *t: upsampling.bfloat16()(*t, output_size=[15, 11]), x)
    upsampling.half()
    by_hand_last = _layer_in_bfloat16(upsampling, channels_last)
    refused = torch.randn(2, 5, 7, 5).half()                  # 5 channels where the weight takes 6
    with pytest.raises(RuntimeError) as ported:
        copy.deepcopy(upsampling).bfloat16()(refused.bfloat16())
    _bfloat16_products(speeds)
    trained = upsampling(x)
    assert trained.grad_fn is not None and counts == {"packed": 0, "computed": 0}
    with torch.no_grad():
        _each_layer_twice_as_by_hand(layers, dict.fromkeys(layers, x), by_hand)
        assert counts == {"packed": 3, "computed": 6}
        ours = upsampling(channels_last)
        assert ours.is_contiguous(memory_format=torch.channels_last) and not ours.is_contiguous()
        _close_to_bfloat16s(ours, by_hand_last)
        _close_to_bfloat16s(upsampling(x, output_size=[15, 11]), sized)       # an output padding of 1
        assert counts["packed"] == 4 and counts.results_at[-1][1] == [1, 1]
        keyword = F.conv_transpose2d(x, upsampling.weight, stride=2, padding=1)
        _close_to_bfloat16s(keyword, by_hand["upsampling"])      # packed again: no output padding
        assert counts == {"packed": 5, "computed": 9}
        upsampling.weight.mul_(2)
        _close_to_bfloat16s(upsampling(x), _layer_in_bfloat16(upsampling, x))
        assert counts == {"packed": 6, "computed": 10}
        assert torch.equal(upsampling(x[0]), _layer_in_bfloat16(upsampling, x[0]))
        with pytest.raises(RuntimeError) as ours_refused:
            upsampling(refused)
        assert counts == {"packed": 6, "computed": 10}
    assert str(ours_refused.value) == str(ported.value)       # torch's own message, as in a port
    assert counts.results_at[:3] == [([1, 1], [0, 0], [2, 2], [1, 1], 1), ([1, 1], [0, 0], [1, 1], [2, 2], 3),
                                     ([1, 1], [1, 1], [2, 2], [1, 1], 1)]
    assert _counted("torch.nn.functional.conv_transpose2d") == "float16 computed in bfloat16"


def test_a_conv_transpose1d_layer_in_bfloat16_packs_its_weight_as_one_of_height_one(speeds, monkeypatch):
    """A float16 conv_transpose1d computed in bfloat16 (a vocoder's upsampling: HiFi-GAN's, BigVGAN's)
    is packed as a conv_transpose2d of height one: its weight packed once, for its arguments, and
    its result dense and contiguous as cuDNN returns a 1-D convolution's, from a contiguous input
    or one transposed from (batch, position, channel), holding torch's bfloat16 conv_transpose1d
    rounded to float16, for the forms nn.ConvTranspose1d calls (stride, output padding, an output
    size, groups, dilation). An unbatched input is torch's own."""
    counts = _convolutions_counted(monkeypatch, transposed=True)
    torch.manual_seed(8)
    layers = {"upsampling": torch.nn.ConvTranspose1d(6, 8, 16, stride=8, padding=4),
              "grouped, dilated": torch.nn.ConvTranspose1d(6, 9, 3, padding=1, groups=3, dilation=2, bias=False),
              "output padding": torch.nn.ConvTranspose1d(6, 8, 3, stride=2, padding=1, output_padding=1)}
    layers = {name: layer.half().eval() for name, layer in layers.items()}
    inputs = {"upsampling": torch.randn(2, 6, 9).half(), "grouped, dilated": torch.randn(2, 6, 13).half(),
              "output padding": torch.randn(2, 11, 6).half().transpose(1, 2)}
    by_hand = {name: _layer_in_bfloat16(layer, inputs[name]).contiguous() for name, layer in layers.items()}
    upsampling = layers["upsampling"]
    sized = _by_hand_in_bfloat16(lambda *t: upsampling.bfloat16()(*t, output_size=[73]), inputs["upsampling"])
    upsampling.half()
    unbatched = _layer_in_bfloat16(upsampling, inputs["upsampling"][0])
    _bfloat16_products(speeds)
    with torch.no_grad():
        _each_layer_twice_as_by_hand(layers, inputs, by_hand)
        assert counts == {"packed": 3, "computed": 6}
        assert counts.results_at == [([0, 4], [0, 0], [1, 8], [1, 1], 1), ([0, 1], [0, 0], [1, 1], [1, 2], 3),
                                     ([0, 1], [0, 1], [1, 2], [1, 1], 1)]
        _close_to_bfloat16s(upsampling(inputs["upsampling"], output_size=[73]), sized)
        assert counts["packed"] == 4 and counts.results_at[-1][1] == [0, 1]
        assert torch.equal(upsampling(inputs["upsampling"][0]), unbatched)
        assert counts == {"packed": 4, "computed": 7}
    assert _counted("torch.nn.functional.conv_transpose1d") == "float16 computed in bfloat16"


def test_a_conv_transpose3d_layer_in_bfloat16_packs_its_weight_and_lays_out_its_result_as_cuda_does(
        speeds, monkeypatch):
    """A float16 conv_transpose3d computed in bfloat16 (a volumetric U-Net's decoder) reads its
    weight packed once for oneDNN's 3-D transposed convolution of its arguments; its result holds
    torch's bfloat16 conv_transpose3d rounded to float16, channel-first from a channel-first input
    and channels-last from a channels-last one, as CUDA lays it out."""
    counts = _convolutions_counted(monkeypatch, transposed=True)
    torch.manual_seed(9)
    layers = {"upsampling": torch.nn.ConvTranspose3d(4, 8, 2, stride=2),
              "grouped, output padding": torch.nn.ConvTranspose3d(4, 6, 3, stride=(1, 2, 2), padding=1,
                                                                  output_padding=(0, 1, 1), groups=2, bias=False)}
    _each_volumetric_layer_packs_once(speeds, counts, layers, torch.randn(2, 4, 3, 5, 4).half(), "upsampling")
    assert counts.results_at == [([0, 0, 0], [0, 0, 0], [2, 2, 2], [1, 1, 1], 1),
                                 ([1, 1, 1], [0, 1, 1], [1, 2, 2], [1, 1, 1], 2)]
    assert _counted("torch.nn.functional.conv_transpose3d") == "float16 computed in bfloat16"


@pytest.mark.parametrize("faster", ["packed", "plain"])
def test_each_kind_of_convolution_runs_in_the_form_timed_faster_at_its_first_call(speeds, monkeypatch, faster):
    """A float16 convolution computed in bfloat16 is timed at the first call of its kind (the
    layer's sizes and arguments, the input's layout, its positions to the power of two) on its
    packed weight and as torch's own on plain copies: each later call of the kind, another layer's
    too, takes the faster form untimed, and only the copies that form reads are kept. Another
    class of input sizes, and a transposed convolution, are kinds of their own. The values are
    torch's bfloat16 convolution's either way; deactivation forgets the choices."""
    from cudashim.patches import precision
    counts = _convolutions_counted(monkeypatch)
    timed = _packed_timed_faster(monkeypatch, *((1.0, 2.0) if faster == "packed" else (2.0, 1.0)))
    torch.manual_seed(7)
    layer, twin = (torch.nn.Conv2d(6, 8, 3, padding=1).half().eval() for _ in range(2))
    upsampling = torch.nn.ConvTranspose2d(6, 8, 4, stride=2, padding=1).half().eval()
    x, alike, wider = torch.randn(2, 6, 11, 9).half(), torch.randn(2, 6, 12, 8).half(), torch.randn(8, 6, 11, 9).half()
    by_hand = {name: _layer_in_bfloat16(module, given) for name, module, given in (
        ("x", layer, x), ("alike", layer, alike), ("twin", twin, x), ("wider", layer, wider),
        ("upsampling", upsampling, x))}
    _bfloat16_products(speeds)
    packed_calls = 1 if faster == "packed" else 0
    with torch.no_grad():
        _close_to_bfloat16s(layer(x), by_hand["x"])
        assert len(timed) == 1 and counts["computed"] == 1        # the packed form's first call
        for _ in range(2):
            _close_to_bfloat16s(layer(x), by_hand["x"])
        _close_to_bfloat16s(layer(alike), by_hand["alike"])       # 96 positions as 99: one class
        _close_to_bfloat16s(twin(x), by_hand["twin"])
        assert len(timed) == 1 and counts["computed"] == 1 + 4 * packed_calls
        cache = _kept_copies()
        for parameter in (layer.weight, layer.bias, twin.weight, twin.bias):
            key = (id(parameter), BF16)
            assert (key in cache.packed_convolutions.copies) == (faster == "packed")
            assert (key in cache.copies) == (faster == "plain")
        _close_to_bfloat16s(layer(wider), by_hand["wider"])       # 792 positions: a class of its own
        _close_to_bfloat16s(upsampling(x), by_hand["upsampling"])
        assert len(timed) == 3
        assert [kind[0] for kind in precision._PACKED_OR_PLAIN.chosen] == \
            ["convolution", "convolution", "transposed convolution"]
        assert set(precision._PACKED_OR_PLAIN.chosen.values()) == {0 if faster == "packed" else 1}
    import cudashim
    cudashim.deactivate()
    assert not precision._PACKED_OR_PLAIN.chosen


def test_a_convolution_slower_on_its_packed_weight_is_timed_so_and_runs_on_plain_copies(speeds, monkeypatch,
                                                                                      cpu_of_its_own):
    """Timed for real: a packed form that takes 200 ms a call loses to torch's own convolution of
    a small input, whatever else the machine runs, and is not called again."""
    import time
    from cudashim.backends import timing
    from cudashim.kernels import packed_convolution
    from cudashim.patches import precision
    counts = _convolutions_counted(monkeypatch)
    computing = packed_convolution.convolution

    def slowly(*args, **kwargs):
        time.sleep(0.2)
        return computing(*args, **kwargs)
    monkeypatch.setattr(packed_convolution, "convolution", slowly)
    monkeypatch.setattr(precision._PACKED_OR_PLAIN, "stopwatch", timing.Stopwatch)
    torch.manual_seed(8)
    layer = torch.nn.Conv2d(4, 4, 3, padding=1).half().eval()
    x = torch.randn(1, 4, 6, 6).half()
    _bfloat16_products(speeds)
    with torch.no_grad():
        _close_to_bfloat16s(layer(x), _layer_in_bfloat16(layer, x))
        computed = counts["computed"]
        assert computed >= 4                         # set up, then timed in turns
        _close_to_bfloat16s(layer(x), _layer_in_bfloat16(layer, x))
    assert counts["computed"] == computed
    (packed_ms, plain_ms), = precision._PACKED_OR_PLAIN.timings.values()
    assert packed_ms >= 200 > plain_ms


@pytest.mark.parametrize("warmed_up", [True, False])
def test_float16_calls_a_cuda_graph_captured_replay_what_they_compute_on_the_replays_values(speeds, warmed_up):
    """A float16 model captured in a CUDA graph, warmed up first as torch's documentation asks or
    not, replays what its calls compute on the values the replay finds: a new batch copied into the
    static input, and weights loaded in place between replays (``load_state_dict``), through a
    conv2d, a linear layer, ``torch.matmul``, an in-place ``addmm_`` and an ``mm`` into ``out=``,
    computed in bfloat16, and a group norm the host times faster in float32. A replay runs only the ops recorded: the policy's compiled conversions,
    kept copies and lent buffers stay out of the capture."""
    from cudashim.precision import BFLOAT16, FLOAT32, MatmulChoices
    torch.manual_seed(9)
    conv = torch.nn.Conv2d(4, 6, 3, padding=1).half().eval()
    norm = torch.nn.GroupNorm(2, 6).half().eval()
    linear = torch.nn.Linear(6 * 8 * 8, 16).half().eval()
    other = torch.randn(16, 16).half()
    accumulated = torch.randn(2, 16).half()
    speeds(FAST_BF16, matmuls=MatmulChoices(BFLOAT16, BFLOAT16, 4, "test"), ops={"group_norm": _timed(FLOAT32)})
    conv.cuda(), norm.cuda(), linear.cuda()
    x, other, accumulated = torch.randn(2, 4, 8, 8).half().cuda(), other.cuda(), accumulated.cuda()
    out = torch.empty(2, 16, dtype=HALF, device="cuda")

    def step():
        features = linear(norm(conv(x)).flatten(1))
        mixed = torch.matmul(features, other)
        added = accumulated.clone().addmm_(features, other)
        torch.mm(mixed, other, out=out)
        return features, mixed, added

    with torch.no_grad():
        if warmed_up:
            step()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        x.copy_(torch.randn(2, 4, 8, 8).half())
        for module in (conv, norm, linear):
            module.load_state_dict({name: value.mul(0.5) for name, value in module.state_dict().items()})
        graph.replay()
        replayed = [value.clone() for value in (*captured, out)]
        expected = step()
        expected = [*(value.clone() for value in expected), out.clone()]
    for ours, eager in zip(replayed, expected):
        assert ours.dtype == HALF
        torch.testing.assert_close(ours.float(), eager.float(), rtol=2 ** -6, atol=2 ** -5)


def test_a_conv2d_is_left_to_torch_where_packing_cannot_take_it(speeds, monkeypatch):
    """Training records a gradient through the weight; padding "same" that torch pads unevenly
    (an even kernel), an input laid out neither way, a weight that is no parameter, an unbatched
    input: torch's own bfloat16 convolution, with the same values. A call torch refuses raises
    torch's own error; a program that turned oneDNN off packs nothing."""
    counts = _convolutions_counted(monkeypatch)
    torch.manual_seed(1)
    layer = torch.nn.Conv2d(4, 6, 3, padding=1).half()
    even = torch.nn.Conv2d(4, 6, 2, padding="same").half().eval()
    x = torch.randn(2, 4, 8, 8).half()
    gapped = torch.randn(2, 4, 8, 16).half()[..., ::2]
    loose = torch.randn(6, 4, 3, 3).half()
    expected = _layer_in_bfloat16(layer, x)
    _bfloat16_products(speeds)
    trained = layer(x)
    assert trained.grad_fn is not None and torch.equal(trained.detach(), expected)
    with torch.no_grad():
        _close_to_bfloat16s(even(x), _layer_in_bfloat16(even, x))
        assert torch.equal(layer(gapped), _layer_in_bfloat16(layer, gapped))
        assert torch.equal(F.conv2d(x, loose, padding=1), _by_hand_in_bfloat16(lambda *t: F.conv2d(*t, padding=1), x, loose))
        assert torch.equal(layer(x[0]), _layer_in_bfloat16(layer, x[0]))
        with torch.backends.mkldnn.flags(enabled=False):
            assert torch.equal(layer(x), expected)
        assert counts == {"packed": 0, "computed": 0}
        with pytest.raises(RuntimeError) as ours:
            layer(torch.randn(2, 3, 8, 8).half())            # 3 channels for 4
        with pytest.raises(RuntimeError) as torchs:
            layer.float()(torch.randn(2, 3, 8, 8))
        assert str(ours.value).split(",")[0] == str(torchs.value).split(",")[0]


def test_a_packed_convolution_weight_is_kept_within_the_budget_and_dropped_with_its_parameter(monkeypatch):
    """A conv2d's packed copy is kept as a linear layer's is, with the arguments it was packed
    for: packed again for others, dropped with the parameter's other copies and at a clear.
    (A stand-in packs: the bookkeeping is the cache's on every host.)"""
    from cudashim.kernels import packed_convolution
    from cudashim.patches.precision import WideningCache
    monkeypatch.setattr(packed_convolution, "pack", lambda weight, *arguments: weight.clone())
    cache = WideningCache(budget_bytes=200 * 2)
    weight = torch.nn.Parameter(torch.ones(4, 2, 3, 3).half(), requires_grad=False)   # 72 numbers
    plain = cache.widen(weight, BF16)
    one = ([1, 1], [1, 1], [1, 1], 1)
    packed = cache.packed_convolution_weight(weight, one, [1, 2, 5, 5])
    assert cache.packed_convolution_weight(weight, one, [1, 2, 5, 5]) is packed and torch.equal(packed, plain)
    assert (id(weight), BF16) not in cache.copies and cache.held == 72 * 2
    other = cache.packed_convolution_weight(weight, ([0, 0], [2, 2], [1, 1], 1), [1, 2, 5, 5])
    assert other is not packed and cache.held == 72 * 2
    cache.drop(weight)
    assert not cache.packed_convolutions.copies and cache.held == 0
    cache.packed_convolution_weight(weight, one, [1, 2, 5, 5])
    cache.clear()
    assert not cache.packed_convolutions.copies and not cache.packed_convolutions.arguments and cache.held == 0


def test_a_linear_layer_is_not_packed_where_a_gradient_is_recorded_or_onednn_is_off(speeds, monkeypatch):
    """Training records a gradient through the weight: torch's own bfloat16 linear, which
    autograd knows. A program that turned oneDNN off, or a torch that cannot pack, keeps its
    plain bfloat16 copy. The results are the same."""
    from cudashim.kernels import packed_linear
    counts = _packing_counted(monkeypatch)
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 32).half()
    x = torch.randn(4, 16, 64).half()
    expected = _by_hand_in_bfloat16(F.linear, x, layer.weight, layer.bias)
    _bfloat16_products(speeds)
    trained = layer(x)
    assert trained.grad_fn is not None and torch.equal(trained.detach(), expected)
    with torch.no_grad(), torch.backends.mkldnn.flags(enabled=False):
        assert torch.equal(layer(x), expected)
    assert counts == {"packed": 0, "computed": 0}
    monkeypatch.setattr(packed_linear, "unavailable", lambda: "this torch cannot pack")
    with torch.no_grad():
        assert torch.equal(layer(x), expected) and torch.equal(layer(x), expected)
    assert counts == {"packed": 0, "computed": 0}


def test_a_packed_weight_is_kept_within_the_budget_in_place_of_its_plain_copy(monkeypatch):
    """The packed copy counts against the copies' budget, replaces a plain bfloat16 copy of the
    same weight, goes with the weight, and is dropped with its other copies. Past the budget
    nothing is packed: packing on every call would cost more than it saves. (A stand-in packs:
    the bookkeeping is the cache's on every host.)"""
    from cudashim.kernels import packed_linear
    from cudashim.patches.precision import WideningCache
    monkeypatch.setattr(packed_linear, "pack", lambda weight: weight.clone())
    cache = WideningCache(budget_bytes=100 * 2)               # room for 100 bfloat16 numbers
    weight, other = (torch.nn.Parameter(torch.ones(n, 8).half(), requires_grad=False) for n in (8, 6))
    plain = cache.widen(weight, BF16)
    assert cache.held == 64 * 2
    packed = cache.packed_weight(weight)
    assert cache.packed_weight(weight) is packed and packed is not plain and torch.equal(packed, plain)
    assert (id(weight), BF16) not in cache.copies and cache.held == 64 * 2
    assert cache.packed_weight(other) is None and cache.held == 64 * 2      # 48 more: past the budget
    cache.drop(weight)
    assert not cache.packed.copies and cache.held == 0
    assert cache.packed_weight(other) is not None and cache.held == 48 * 2
    del other
    assert cache.held == 0 and not cache.packed.copies


def test_a_tensor_is_dense_in_any_order_of_its_dimensions_and_staged_as_empty_like_lays_it_out():
    """The compiled conversion takes a tensor whose elements fill its memory in any order of
    its dimensions; one with gaps or overlaps is staged first, in the layout torch's
    ``empty_like`` gives a copy of it."""
    from cudashim.kernels.native import dense, dense_strides
    x = torch.empty(2, 3, 4, 5)
    for laid_out in (x, x.permute(0, 2, 1, 3), x.transpose(0, 3), x[:1], x[:1].transpose(1, 3),
                     x.contiguous(memory_format=torch.channels_last), torch.empty(0, 3)):
        assert dense(laid_out)
    gapped = (x[:, :, :2], x[:, :, :1], x[..., ::2], x.permute(0, 2, 1, 3)[:, 1:],
              torch.empty(3, 1).expand(3, 4),
              torch.empty(2, 16, 192).split(64, dim=2)[1].view(2, 16, 4, 16).transpose(1, 2))
    for staged in gapped:
        assert not dense(staged)
        assert dense_strides(staged) == torch.empty_like(staged).stride(), staged.stride()


def test_inference_without_no_grad_lends_buffers_only_to_calls_that_record_nothing(speeds):
    """Gradients on but no operand requiring one (inference written without no_grad): the
    operands go through the kept buffers, and every result is its own; a call whose weight
    requires a gradient borrows nothing."""
    from cudashim.patches.precision import _SCRATCH
    torch.manual_seed(4)
    frozen = torch.nn.Linear(32, 32).half().requires_grad_(False)
    trained = torch.nn.Linear(32, 32).half()
    batches = [torch.randn(16, 32).half() for _ in range(3)]
    expected = [_by_hand_in_bfloat16(lambda x, w, b: F.linear(x, w, b), x, frozen.weight, frozen.bias)
                for x in batches]
    _bfloat16_products(speeds)
    results = [frozen(x) for x in batches]
    assert all(torch.equal(r, e) for r, e in zip(results, expected)) and _SCRATCH.held > 0
    _SCRATCH.clear()
    trained(batches[0]).float().sum().backward()
    assert _SCRATCH.held == 0 and trained.weight.grad is not None


def test_the_first_conversion_works_under_a_float16_default_tensor_type(speeds, monkeypatch):
    """The compiled kernels choose their variant at first use, which can be a float16 layer
    of a program that made ``torch.cuda.HalfTensor`` its default tensor type: the choice's
    probe names its dtypes and device (it handed float16 memory to a float32 kernel, and
    the program died of a corrupted heap)."""
    from cudashim.kernels import native
    torch.manual_seed(5)
    x, weight = torch.randn(16, 32).half(), torch.randn(8, 32).half()
    expected = _by_hand_in_bfloat16(F.linear, x, weight)
    _bfloat16_products(speeds)
    monkeypatch.setattr(native, "_choice", None)
    torch.set_default_tensor_type(torch.cuda.HalfTensor)
    try:
        ours = F.linear(x, weight)
        chosen = native.variant()
    finally:
        torch.set_default_tensor_type(torch.FloatTensor)
    assert torch.equal(ours, expected)
    assert chosen == next((v.name for v in native.variants() if v.runs_here), None)


def test_a_result_that_is_a_view_of_a_converted_operand_leaves_the_operand_alone(speeds):
    """A trivial einsum returns a view of its converted operand: rounding it to float16 never
    writes into that operand, neither a buffer a later call reuses nor a frozen weight's kept
    bfloat16 copy, which the next call reads."""
    torch.manual_seed(1)
    first, second = torch.randn(32, 24).half(), torch.randn(32, 24).half()
    weight = torch.nn.Parameter(torch.randn(24, 24).half(), requires_grad=False)
    _bfloat16_products(speeds)
    with torch.no_grad():
        kept, transposed = torch.einsum("ij->ij", first), torch.einsum("ij->ji", first)
        torch.einsum("ij->ij", second)
        torch.mm(second, second.t())
        weight_itself = torch.einsum("ij->ij", weight)
        product = torch.einsum("ij,jk->ik", first, weight)
    assert torch.equal(kept, first.float().bfloat16().half()) and torch.equal(transposed, kept.t())
    assert torch.equal(weight_itself, weight.float().bfloat16().half())
    assert torch.equal(product, _by_hand_in_bfloat16(lambda x, w: torch.einsum("ij,jk->ik", x, w), first, weight))


def test_training_in_bfloat16_never_lends_an_operand_autograd_saved(speeds):
    """With gradients recorded a convolution saves its input for the weight's gradient: a
    second forward of the same sizes before the first's backward leaves that input alone."""
    torch.manual_seed(2)
    conv = torch.nn.Conv2d(4, 8, 3, padding=1, bias=False).half()
    first, second = torch.randn(2, 4, 8, 8).half(), torch.randn(2, 4, 8, 8).half()
    reference = conv.weight.detach().float().bfloat16().requires_grad_()
    F.conv2d(first.float().bfloat16(), reference, padding=1).float().sum().backward()
    _bfloat16_products(speeds)
    loss = conv(first).float().sum()
    conv(second)
    loss.backward()
    assert torch.equal(conv.weight.grad, reference.grad.float().half())


def test_replicas_in_threads_convert_into_buffers_of_their_own(speeds):
    """DataParallel runs its replicas' forwards in threads: each thread's conversions are its
    own, so concurrent calls of the same sizes give each its own result."""
    import threading
    torch.manual_seed(3)
    weight = torch.randn(64, 64).half()
    batches = [torch.randn(256, 64).half() for _ in range(4)]
    expected = [_by_hand_in_bfloat16(torch.mm, x, weight) for x in batches]
    _bfloat16_products(speeds)
    results, start = {}, threading.Barrier(len(batches))

    def replica(index):
        start.wait()
        with torch.no_grad():
            for _ in range(20):
                results[index] = torch.mm(batches[index], weight)
    threads = [threading.Thread(target=replica, args=(i,)) for i in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(torch.equal(results[i], expected[i]) for i in range(len(batches)))


def test_a_thread_neither_sees_nor_gives_back_what_another_borrowed():
    import threading
    from cudashim.patches.precision import ConversionScratch
    scratch = ConversionScratch()
    x = torch.randn(64).half()
    mine = scratch.converted(x, torch.float32)
    seen = {}

    def other_thread():
        seen["lent before"] = scratch.lending()
        scratch.converted(x, torch.float32)
        scratch.given_back(0, None)
        seen["held after"] = scratch.held
    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert seen == {"lent before": 0, "held after": 64 * 4}
    assert scratch.lending() == 1 and scratch.held == 0 and torch.equal(mine, x.float())


def test_kept_conversion_buffers_stay_within_their_budget():
    from cudashim.patches.precision import ConversionScratch
    scratch = ConversionScratch()
    scratch.budget = 3000
    for size in (1000, 1000, 800, 2000):
        scratch._keep(torch.empty(size, dtype=torch.uint8))
    assert scratch.held == 2800 and sorted(scratch.free) == [800, 2000]   # the 1000s went first
    scratch._keep(torch.empty(4000, dtype=torch.uint8))
    assert scratch.held == 0 and not scratch.free                          # too large to keep


def test_distances_and_bilinear_forms_are_computed_in_float32_where_products_run_in_bfloat16(speeds):
    """cdist's terms cancel: near points' distances keep their digits only in float32."""
    from cudashim.precision import BFLOAT16, MatmulChoices
    torch.manual_seed(0)
    points = torch.randn(64, 32).half()
    near = (points + 0.01 * torch.randn(64, 32)).half()
    exact = torch.cdist(points.double(), near.double())
    speeds(FAST_BF16, matmuls=MatmulChoices(BFLOAT16, BFLOAT16, 4, "test"), report=True)
    ours = torch.cdist(points, near)
    assert ours.dtype == HALF and _counted("torch.cdist") == "float16 computed in float32"
    assert torch.allclose(ours.double(), exact, rtol=2e-3, atol=1e-3)
    inner = torch.inner(points, near)                                 # the products still in bfloat16
    assert torch.equal(inner, torch.inner(points.bfloat16(), near.bfloat16()).half())
    # bilinear runs slower in bfloat16 than in float32 on every host measured: float32 too
    weight = torch.randn(4, 32, 32).half()
    assert torch.equal(F.bilinear(points, near, weight),
                       F.bilinear(points.float(), near.float(), weight.float()).half())
    assert _counted("torch.nn.functional.bilinear") == "float16 computed in float32"


def test_an_out_call_is_refused_and_resized_as_torch_does(speeds):
    x, w, _ = _half_inputs()
    speeds(SLOW_BOTH, report=True)
    with pytest.raises(RuntimeError, match="out="):                    # gradients through out=
        torch.mm(x.clone().requires_grad_(), w.t(), out=torch.empty(32, 48, dtype=HALF))
    wrong = torch.zeros(4, 4, dtype=HALF)
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        assert torch.mm(x, w.t(), out=wrong) is wrong
    assert wrong.shape == (32, 48) and torch.equal(wrong, (x.float() @ w.float().t()).half())
    assert _counted("torch.mm") == "float16 computed in float32"


def test_a_float16_product_traced_by_autograd_in_place_trains_as_torch_does(speeds):
    torch.manual_seed(0)
    x = torch.randn(8, 16).half().requires_grad_()
    w = torch.randn(16, 16).half().requires_grad_()
    native = [t.detach().clone().requires_grad_() for t in (x, w)]
    (native[0] * 1).addmm_(native[0], native[1]).float().sum().backward()
    speeds(SLOW_BOTH)
    (x * 1).addmm_(x, w).float().sum().backward()
    for ours, theirs in zip((x, w), native):
        assert ours.grad.dtype == HALF and torch.allclose(ours.grad.float(), theirs.grad.float(), rtol=1e-2)
    with pytest.raises(RuntimeError, match="leaf Variable"):           # torch's refusal stands
        w.addmm_(x.t(), x)


def _counted(name):
    import cudashim.activation as activation
    return activation.current_activation().report.entries[name]["became"]


def test_attention_computes_in_the_choices_measured_on_its_own_shapes(speeds):
    """Attention keeps no weights, and torch's CPU kernels for it are not its products': it
    computes in its own choices. A decoding step's attention (one query over a cache) in float32
    where a product of as few rows runs as asked; a prefill's in bfloat16; each result float16,
    what its choice computes by hand, and reported as what it became."""
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32, MatmulChoices
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(64, 64).half(), requires_grad=False)
    x = torch.randn(2, 1, 64).half()
    query = torch.randn(2, 4, 1, 16).half()
    keys, values = torch.randn(2, 4, 24, 16).half(), torch.randn(2, 4, 24, 16).half()
    prompt = torch.randn(2, 4, 24, 16).half()
    attention = lambda *t: F.scaled_dot_product_attention(*t)             # noqa: E731
    prefill = lambda *t: F.scaled_dot_product_attention(*t, is_causal=True)   # noqa: E731
    expected = {"step": attention(query.float(), keys.float(), values.float()).half(),
                "prefill": _by_hand_in_bfloat16(prefill, prompt, keys, values),
                "projection": F.linear(x, weight)}
    assert not torch.equal(expected["step"], attention(query, keys, values))    # torch's own differs
    speeds(FAST_BF16, matmuls=MatmulChoices(AS_ASKED, BFLOAT16, 4, "test",
                                            attention=MatmulChoices(FLOAT32, BFLOAT16, 4, "test")),
           report=True)
    with torch.no_grad():
        ours = {"step": attention(query, keys, values), "prefill": prefill(prompt, keys, values),
                "projection": F.linear(x, weight)}
    for name, result in ours.items():
        assert result.dtype == HALF and torch.equal(result, expected[name]), name
    api = "torch.nn.functional.scaled_dot_product_attention"
    assert _counted(f"{api} (memory-bound)") == "float16 computed in float32"
    assert _counted(api) == "float16 computed in bfloat16"
    assert _counted("torch.nn.functional.linear (memory-bound)") == "float16 as asked"


class _HalfBlock(torch.nn.Module):
    """A float16 model's calls the policy wraps: a linear layer, attention, a convolution (torch.conv2d
    and F.conv2d both replaced), cosine similarities (the exact reductions' wrapper beneath the
    policy's), a product of activations, and argmax."""

    def __init__(self):
        super().__init__()
        self.projection = torch.nn.Linear(32, 96)
        self.convolution = torch.nn.Conv2d(4, 4, 3, padding=1)

    def forward(self, x, image):
        q, k, v = self.projection(x).view(2, 8, 3, 4, 8).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(2, 8, 32)
        similar = F.cosine_similarity(attended, x, dim=-1)
        scores = torch.matmul(attended, x.transpose(1, 2))
        return attended, similar, scores, scores.argmax(-1), self.convolution(image)


@needs_onednn_precision
def test_a_float16_model_under_torch_compile_is_one_graph_of_the_policys_choices(speeds):
    """torch.compile of a float16 model whose calls the policy computes in bfloat16 and float32:
    dynamo traces the policy as torch ops (no kept buffers, weights or compiled conversions, which
    broke the graph at every call), one graph without a break, whose results are the eager
    calls' to bfloat16's rounding. Under the program's TF32 flags a float32 choice (attention's)
    computes in bfloat16 there, as compiled code cannot turn oneDNN's bfloat16 precision off
    around it."""
    from cudashim.precision import BFLOAT16, FLOAT32, MatmulChoices
    torch.manual_seed(2)
    block = _HalfBlock().half().eval()
    x, image = torch.randn(2, 8, 32).half(), torch.randn(2, 4, 6, 6).half()
    speeds(FAST_BF16, matmuls=MatmulChoices(BFLOAT16, BFLOAT16, 4, "test",
                                            attention=MatmulChoices(FLOAT32, FLOAT32, 4, "test")))
    torch.backends.cuda.matmul.allow_tf32 = True
    eager, explained, compiled = explained_and_compiled(block, x, image)
    code = explained.graphs[0].code
    assert "bfloat16" in code and "float32" not in code, code
    for ours, theirs in zip(compiled, eager):
        assert ours.dtype == theirs.dtype
        if ours.is_floating_point():
            torch.testing.assert_close(ours.float(), theirs.float(), rtol=2 ** -6, atol=2 ** -6)
    assert torch.equal(compiled[3], compiled[2].argmax(-1))


@needs_onednn_precision
def test_a_float32_choice_runs_in_plain_float32_under_the_programs_tf32_flags(speeds, monkeypatch):
    """Where bfloat16 is fast the TF32 flags turn on oneDNN's bfloat16 precision for float32
    matmuls. A float16 call the policy computes in float32 (attention's decoding step here) runs
    in plain float32 all the same, as its choice was timed; the program's own float32 calls keep
    its setting, which stands after the call."""
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32, MatmulChoices
    matmul = torch.backends.mkldnn.matmul
    seen = []
    real = F.scaled_dot_product_attention

    def attention(*args, **kwargs):                  # what the policy wraps: torch's, observed
        seen.append((args[0].dtype, matmul.fp32_precision))
        return real(*args, **kwargs)
    monkeypatch.setattr(F, "scaled_dot_product_attention", attention)
    torch.manual_seed(0)
    query, keys, values = (torch.randn(2, 4, n, 16).half() for n in (1, 24, 24))
    expected = real(query.float(), keys.float(), values.float()).half()
    speeds(FAST_BF16, matmuls=MatmulChoices(AS_ASKED, BFLOAT16, 4, "test",
                                            attention=MatmulChoices(FLOAT32, BFLOAT16, 4, "test")))
    torch.backends.cuda.matmul.allow_tf32 = True
    assert matmul.fp32_precision == "bf16"
    with torch.no_grad():
        step = F.scaled_dot_product_attention(query, keys, values)
        F.scaled_dot_product_attention(keys, keys, values, is_causal=True)           # bfloat16
        F.scaled_dot_product_attention(query.float(), keys.float(), values.float())  # the program's
    assert seen == [(torch.float32, "ieee"), (torch.bfloat16, "bf16"), (torch.float32, "bf16")]
    assert matmul.fp32_precision == "bf16"
    assert step.dtype == HALF and torch.equal(step, expected)


def test_attention_is_measured_on_attention_calls_in_each_choice():
    """The attention table times scaled_dot_product_attention itself, not the products: one
    query over a cache for decoding and a causal prefill, each choice converting its float16
    operands and rounding its result to float16, as the policy does; the classes' boundary as
    the products' is found."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32
    if not all(cpu_speed._runs(BFLOAT16, cpu_speed._attention_call(rows, BFLOAT16)) for rows in (2, 256)):
        pytest.skip("torch's bfloat16 attention does not run under these kernels (the next test covers that)")
    seen = []

    def timed_in_turns(*calls, turns=7):
        results = [call() for call in calls]
        assert all(result.dtype == HALF for result in results)
        rows = results[0].shape[-2]
        seen.append((rows, tuple(results[0].shape)))
        reference = results[0].double()
        # every choice computes the same attention, to its precision
        assert all((result.double() - reference).abs().max() < 0.05 for result in results)
        if len(calls) == 3:                             # a class: float32 fastest decoding
            return [0.5, 0.14, 0.1] if rows == 2 else [4.4, 2.0, 2.5]
        return [0.1, 0.2] if rows < 32 else [1.0, 0.5]  # the boundary: float32 up to 16 queries
    measured = cpu_speed._measure_attention(TimedAs(timed_in_turns))
    assert (measured["memory_bound"], measured["compute_bound"]) == (FLOAT32, BFLOAT16)
    assert measured["memory_bound_rows"] == 16
    assert measured["timings"]["memory-bound"] == {AS_ASKED: 0.5, BFLOAT16: 0.14, FLOAT32: 0.1, "rows": 2}
    assert seen[0] == (2, (2, 8, 2, 64))                # two queries a head over the cache
    assert (256, (2, 8, 256, 64)) in seen and [rows for rows, _ in seen[-4:]] == [4, 8, 16, 32]


def test_a_choice_torch_refuses_here_is_left_out_of_the_table_and_never_chosen():
    """torch's kernels pinned below the CPU's (ATEN_CPU_CAPABILITY=default on a CPU with AMX)
    refuse bfloat16 attention: that choice is not timed, and the fastest of the rest is chosen."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32

    def call(rows, choice):
        def computed():
            if choice == BFLOAT16:
                raise RuntimeError("pack_vnni2 is only supported when avx512 is supported")
            return torch.zeros(1)
        return computed
    timed = []

    def best_of_turns(*calls, turns=7):
        timed.append(len(calls))
        return [0.5, 0.1] if len(calls) == 2 else [0.1]
    measured = cpu_speed._measure_classes(TimedAs(best_of_turns), call)
    assert set(measured["timings"]["memory-bound"]) == {AS_ASKED, FLOAT32, "rows"}
    assert (measured["memory_bound"], measured["compute_bound"]) == (FLOAT32, FLOAT32)
    assert timed[:2] == [2, 2]


def test_explicit_float16_computes_in_each_shape_classs_choice(speeds):
    """Decoding-sized products (a few rows a matrix) run as asked where the host measured
    float16 fastest there; training-sized ones in float32; each result float16, and each
    equal to what its choice computes."""
    from cudashim.precision import AS_ASKED, FLOAT32, MatmulChoices
    import cudashim
    torch.manual_seed(0)
    weight = torch.nn.Parameter(torch.randn(64, 32).half(), requires_grad=False)
    small, large = torch.randn(2, 32).half(), torch.randn(64, 32).half()
    keys = torch.randn(6, 9, 32).half()                          # attention: per-matrix rows
    query = torch.randn(6, 1, 32).half()
    expected = {"small": F.linear(small, weight), "large": torch.mm(large.float(), weight.float().t()).half(),
                "scores": torch.matmul(query, keys.transpose(1, 2))}
    speeds(SLOW_BOTH, matmuls=MatmulChoices(AS_ASKED, FLOAT32, 4, "test"), report=True)
    got = F.linear(small, weight)
    assert got.dtype == HALF and torch.equal(got, expected["small"])
    assert _counted("torch.nn.functional.linear (memory-bound)") == "float16 as asked"
    got = torch.mm(large, weight.t())
    assert got.dtype == HALF and torch.equal(got, expected["large"])
    assert _counted("torch.mm") == "float16 computed in float32"
    assert torch.equal(torch.matmul(query, keys.transpose(1, 2)), expected["scores"])
    assert _counted("torch.matmul (memory-bound)") == "float16 as asked"
    assert cudashim.activation.current_activation().precision.float16_matmuls.memory_bound == AS_ASKED


def test_explicit_float16_in_bfloat16_keeps_a_bfloat16_copy_of_inference_weights(speeds):
    from cudashim.precision import BFLOAT16, MatmulChoices
    torch.manual_seed(0)
    layer = torch.nn.Linear(32, 64).half().requires_grad_(False)
    x = torch.randn(3, 32).half()
    reference = F.linear(x.bfloat16(), layer.weight.bfloat16(), layer.bias.bfloat16()).half()
    speeds(FAST_BF16, matmuls=MatmulChoices(BFLOAT16, BFLOAT16, 4, "test"), report=True)
    assert torch.equal(layer(x), reference) and layer(x).dtype == HALF
    assert _counted("torch.nn.functional.linear (memory-bound)") == "float16 computed in bfloat16"


def test_other_dtypes_go_straight_to_torch(speeds):
    x, w, m3 = _half_inputs()
    inputs = {dtype: (x.to(dtype), w.to(dtype), m3.to(dtype)) for dtype in (torch.float32, BF16)}
    native = {dtype: [call() for _, call in _family(*inputs[dtype])] for dtype in inputs}
    speeds(SLOW_BOTH)
    for dtype in inputs:
        for before, (name, call) in zip(native[dtype], _family(*inputs[dtype])):
            assert torch.equal(call(), before), (dtype, name)
    with pytest.raises(RuntimeError):                     # mixed dtypes: torch's own error
        F.linear(x, w.float())


def test_where_the_fast_path_runs_the_family_is_its_compiled_gate_and_agrees_with_python(speeds):
    """Each function of the family is a compiled gate carrying its Python twin: both give the
    same result in float16 and outside it, torch's own refusal of mixed dtypes outside a
    float32 region and the same reconciliation inside one."""
    from cudashim import speedups
    import cudashim
    if speedups.chosen(cudashim._settings.load()) is None:
        pytest.skip("the compiled fast path does not run here")
    x, w, m3 = _half_inputs()
    speeds(SLOW_BOTH)
    gates = {"F.linear": F.linear, "torch.mm": torch.mm, "torch.einsum": torch.einsum,
             "Tensor.__matmul__": torch.Tensor.__matmul__}
    for name, gate in gates.items():
        assert type(gate).__name__ == "HalfGate" and gate.python_twin.__wrapped__ is gate.__wrapped__, name
    calls = {
        "F.linear": [((x, w), {}), ((x.float(), w.float()), {}), ((), {"input": x, "weight": w}),
                     ((x.to(BF16), w.float()), {})],
        "torch.mm": [((x, w.t()), {}), ((x.float(), w.float().t()), {}), ((x.float(), w.t()), {})],
        "torch.einsum": [(("bij,bkj->bik", m3, m3), {}), (("bij,bkj->bik", [m3, m3]), {}),
                         (("bij,bkj->bik", (m3.float(), m3.float())), {})],
        "Tensor.__matmul__": [((x, w.t()), {}), ((x.float(), w.float().t()), {})],
    }
    for region in (False, True):
        for name, gate in gates.items():
            for args, kwargs in calls[name]:
                results = []
                for call in (gate, gate.python_twin):
                    try:
                        if region:
                            with torch.autocast("cuda", dtype=BF16):      # run in float32 here
                                results.append(call(*args, **kwargs))
                        else:
                            results.append(call(*args, **kwargs))
                    except RuntimeError as refusal:
                        results.append(str(refusal))
                ours, twin = results
                if isinstance(ours, str):
                    assert not region and ours == twin, (name, ours, twin)
                else:
                    assert torch.equal(ours, twin) and ours.dtype == twin.dtype, (name, region)
    assert (x @ w.t()).dtype == HALF and x.float().mm(w.float().t()).dtype == torch.float32


def test_a_region_run_in_float32_computes_the_dtypes_autocast_would_have_cast(speeds):
    """Fabric's "bf16-mixed" hands bfloat16 batches to float32 weights inside the CUDA region,
    which autocast reconciles. Where the policy runs the region in float32, the matmul family
    computes them in float32 (and gives float32, the region's dtype); outside, after the
    region, and in another thread, torch's own refusal stands."""
    import threading
    x, w, m3 = _half_inputs()
    speeds(SLOW_BOTH)
    for inputs in [(x.to(BF16), w.float(), m3.float()), (x.float(), w, m3.to(BF16))]:
        wanted = dict(_family(*(t.float() for t in inputs)))
        for name, call in _family(*inputs):
            try:
                outside, refused = call(), False
            except RuntimeError:
                outside, refused = None, True
            with torch.autocast("cuda", dtype=BF16):
                inside = call()
            if refused:                              # mixed: computed in float32
                assert inside.dtype == torch.float32 and torch.allclose(inside, wanted[name]()), name
            else:                                    # one dtype: torch's, as outside
                assert torch.equal(inside, outside), name
        with pytest.raises(RuntimeError):
            F.linear(*inputs[:2])
    refused = []

    def elsewhere():
        try:
            F.linear(x.to(BF16), w.float())
        except RuntimeError as error:
            refused.append(error)
    with torch.autocast("cuda", dtype=torch.float16):
        with torch.autocast("cuda", dtype=BF16):            # nested regions, left in order
            F.linear(x.to(BF16), w.float())
        thread = threading.Thread(target=elsewhere)
        thread.start()
        thread.join()
        assert F.linear(x.to(BF16), w.float()).dtype == torch.float32
    assert len(refused) == 1
    with pytest.raises(ValueError):
        with torch.autocast("cuda", dtype=BF16):
            raise ValueError("left by an exception")
    with pytest.raises(RuntimeError):
        F.linear(x.to(BF16), w.float())


def test_a_region_run_in_float32_replays_in_a_cuda_graph_on_the_weights_the_replay_finds(speeds):
    """Inside a CUDA autocast region the policy runs in float32, a float32 batch through a float16
    layer is computed in float32; captured in a CUDA graph, a replay converts the weight again, so
    weights loaded in place between replays are the ones it reads."""
    speeds(SLOW_BOTH)
    torch.manual_seed(10)
    layer = torch.nn.Linear(8, 4).half().cuda().eval()
    x = torch.randn(3, 8, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=BF16):
        layer(x)                                             # warmed up: the weight's copy kept
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = layer(x)
        layer.load_state_dict({name: value * 3 for name, value in layer.state_dict().items()})
        graph.replay()
        assert captured.dtype == torch.float32
        torch.testing.assert_close(captured, layer(x))
        torch.testing.assert_close(captured, F.linear(x, layer.weight.float(), layer.bias.float()))


def test_a_half_model_trains_and_infers_with_its_dtype_kept(speeds):
    speeds(SLOW_BOTH)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
    model = model.cuda().half()
    x = torch.randn(8, 16, device="cuda").half()
    loss = model(x).float().pow(2).mean()
    loss.backward()
    assert all(p.dtype == HALF and p.grad.dtype == HALF for p in model.parameters())
    reference = model.float()(x.float()).detach()
    model.half()
    with torch.no_grad():
        first = model(x)
        again = model(x)
    assert first.dtype == HALF and torch.equal(first, again)
    assert (first.float() - reference).abs().max() < 1e-2
    with torch.no_grad():                                 # an in-place update is seen
        model[0].weight.mul_(2)
        assert not torch.equal(model(x), first)
    assert all(v.dtype == HALF for v in model.state_dict().values())


def _attention_layers():
    """nn.MultiheadAttention and an nn.TransformerEncoder as inference code holds them: eval,
    float16, run under no_grad, where torch takes their fused paths. One encoder layer: each
    fused call is rounded to float16 once, where a float32 stack of them would not be."""
    torch.manual_seed(0)
    attention = torch.nn.MultiheadAttention(64, 4, batch_first=True)
    encoder = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(
        64, 4, 128, batch_first=True, activation="gelu"), 1, enable_nested_tensor=True)
    return attention.eval().half(), encoder.eval().half()


def _attend(attention, encoder, x, padding):
    """What a program takes from the two: attention's output and weights, and the encoder's
    output for a batch whose second sequence is padded (a nested batch inside)."""
    with torch.no_grad():
        out, weights = attention(x, x, x, need_weights=True)
        return out, weights, encoder(x, src_key_padding_mask=padding)


def test_the_fused_attention_layers_compute_float16_in_each_shape_classs_choice(speeds):
    """The fused inference paths of nn.MultiheadAttention and nn.TransformerEncoderLayer (one
    C call each, their projections inside) compute a batch in float32 where the host chose
    float32 for compute-bound products, exactly as the layers in float32 would, rounded to
    float16; a decoding-sized call runs as asked."""
    import copy
    from cudashim.precision import AS_ASKED, FLOAT32, MatmulChoices
    attention, encoder = _attention_layers()
    x = torch.randn(2, 12, 64).half()
    padding = torch.zeros(2, 12, dtype=torch.bool)
    padding[1, 8:] = True
    wide = _attend(copy.deepcopy(attention).float(), copy.deepcopy(encoder).float(), x.float(), padding)
    token = x[:1, :1]
    as_asked = _attend(attention, encoder, token, padding[:1, :1])
    speeds(SLOW_BOTH, matmuls=MatmulChoices(AS_ASKED, FLOAT32, 4, "test"), report=True)
    for ours, expected in zip(_attend(attention, encoder, x, padding), wide):
        assert ours.dtype == HALF and torch.equal(ours, expected.half())
    assert _counted("torch._native_multi_head_attention") == "float16 computed in float32"
    assert _counted("torch._transformer_encoder_layer_fwd") == "float16 computed in float32"
    for ours, expected in zip(_attend(attention, encoder, token, padding[:1, :1]), as_asked):
        assert ours.dtype == HALF and torch.equal(ours, expected)
    assert _counted("torch._native_multi_head_attention (memory-bound)") == "float16 as asked"
    assert _counted("torch._transformer_encoder_layer_fwd (memory-bound)") == "float16 as asked"


def _encoder_layers_counted(monkeypatch):
    """Counts of weights packed and of encoder layers computed op by op (``kernels.
    packed_encoder_layer``). Skips where linear layers do not pack here, saying why; where they
    do, the encoder layers' probe passes (a wrong value or mask there turns the path off)."""
    from cudashim.kernels import packed_encoder_layer, packed_linear
    reason = packed_linear.unavailable()
    if reason is not None:
        pytest.skip(reason)
    assert packed_encoder_layer.unavailable() is None
    counts = _Counts(packed=0, computed=0, attended=0)
    pack, encoder_layer = packed_linear.pack, packed_encoder_layer.encoder_layer
    self_attention = packed_encoder_layer.self_attention

    def packing(weight):
        counts["packed"] += 1
        return pack(weight)

    def computing(*args, **kwargs):
        counts["computed"] += 1
        return encoder_layer(*args, **kwargs)

    def attending(*args, **kwargs):
        counts["attended"] += 1
        return self_attention(*args, **kwargs)
    monkeypatch.setattr(packed_linear, "pack", packing)
    monkeypatch.setattr(packed_encoder_layer, "encoder_layer", computing)
    monkeypatch.setattr(packed_encoder_layer, "self_attention", attending)
    return counts


def _error(result, exact):
    return (result.double() - exact).abs().max().item()


def test_an_encoder_layer_in_bfloat16_runs_op_by_op_on_packed_weights_as_accurately_as_its_port(speeds, monkeypatch):
    """nn.TransformerEncoderLayer's fused inference path in float16, computed in bfloat16, runs op
    by op on its four weights packed once: over the nested batch nn.TransformerEncoder makes of a
    padded one (sequences of three lengths), and over dense batches with a padding mask, a
    boolean attention mask merged with it, or none, post-norm with GELU and pre-norm with ReLU.
    Each result has the fused call's form and is as close to the layer in float64 as a bfloat16
    port's; padded positions of a nested batch stay zero."""
    import copy
    counts = _encoder_layers_counted(monkeypatch)
    torch.manual_seed(0)
    nested = torch.nn.TransformerEncoder(torch.nn.TransformerEncoderLayer(
        64, 4, 96, batch_first=True, activation="gelu"), 2, enable_nested_tensor=True)
    pre_norm = torch.nn.TransformerEncoderLayer(64, 4, 96, batch_first=True, norm_first=True)
    x = torch.randn(3, 10, 64)
    padding = torch.zeros(3, 10, dtype=torch.bool)
    padding[1, 7:], padding[2, 4:] = True, True
    banded = (torch.arange(10)[:, None] - torch.arange(10)).abs() > 6      # True: left out
    calls = {"nested": (nested, lambda model, t: model(t, src_key_padding_mask=padding)),
             "padded, pre-norm": (pre_norm, lambda model, t: model(t, src_key_padding_mask=padding)),
             "banded and padded": (pre_norm, lambda model, t: model(t, src_mask=banded, src_key_padding_mask=padding)),
             "no mask": (pre_norm, lambda model, t: model(t))}
    models = {id(model): model.half().eval() for model, _ in calls.values()}
    assert len(models) == 2
    x = x.half()
    with torch.no_grad():
        exact = {name: call(copy.deepcopy(model).double(), x.double()) for name, (model, call) in calls.items()}
        port = {name: call(copy.deepcopy(model).bfloat16(), x.bfloat16()) for name, (model, call) in calls.items()}
    _bfloat16_products(speeds)
    with torch.no_grad():
        for name, (model, call) in calls.items():
            for _ in range(2):
                ours = call(model, x)
                assert ours.dtype == HALF and ours.shape == x.shape, name
                assert _error(ours, exact[name]) <= 2 * _error(port[name], exact[name]) + 2 ** -9, name
        assert torch.equal(ours, call(model, x))
        nested_result = calls["nested"][1](nested, x)
    assert counts == {"packed": 12, "computed": 2 * 2 + 3 * 2 + 1 + 2, "attended": 13}
    assert not ours.isnan().any() and ours.abs().max() > 0.5
    assert torch.equal(nested_result[padding], torch.zeros_like(nested_result[padding]))
    assert _counted("torch._transformer_encoder_layer_fwd") == "float16 computed in bfloat16"


def test_multi_head_attention_in_bfloat16_runs_op_by_op_on_packed_weights_with_its_weights(speeds, monkeypatch):
    """nn.MultiheadAttention's fused inference path (self-attention) in float16, computed in
    bfloat16, runs op by op on its two weights packed once, as programs call it: the attention
    weights averaged over the heads (the default), one set per head, or none; a key padding mask,
    an attention mask, or a nested batch. Each result, and each weight, is as close to the layer
    in float64 as a bfloat16 port's."""
    import copy
    counts = _encoder_layers_counted(monkeypatch)
    torch.manual_seed(3)
    attention = torch.nn.MultiheadAttention(64, 4, batch_first=True).half().eval()
    x = torch.randn(3, 9, 64).half()
    padding = torch.zeros(3, 9, dtype=torch.bool)
    padding[1, 6:], padding[2, 3:] = True, True
    causal = torch.ones(9, 9, dtype=torch.bool).triu(1)                      # True: left out
    calls = {"averaged, padded": lambda layer, t: layer(t, t, t, key_padding_mask=padding),
             "each head, causal": lambda layer, t: layer(t, t, t, attn_mask=causal, average_attn_weights=False),
             "no weights, padded": lambda layer, t: layer(t, t, t, key_padding_mask=padding, need_weights=False)}
    with torch.no_grad():
        exact = {name: call(copy.deepcopy(attention).double(), x.double()) for name, call in calls.items()}
        port = {name: call(copy.deepcopy(attention).bfloat16(), x.bfloat16()) for name, call in calls.items()}
        sequences = [x[0], x[1, :6], x[2, :3]]
        wide = copy.deepcopy(attention).double()
        exact_nested = [wide(*[t[None].double()] * 3, need_weights=False)[0][0] for t in sequences]
        nested = torch.nested.nested_tensor(sequences)
    _bfloat16_products(speeds)
    with torch.no_grad():
        for name, call in calls.items():
            ours, weights = call(attention, x)
            assert ours.dtype == HALF and ours.shape == x.shape, name
            assert _error(ours, exact[name][0]) <= 2 * _error(port[name][0], exact[name][0]) + 2 ** -9, name
            if exact[name][1] is None:
                assert weights is None, name
                continue
            assert weights.dtype == HALF and weights.shape == exact[name][1].shape, name
            assert _error(weights, exact[name][1]) <= 2 * _error(port[name][1], exact[name][1]) + 2 ** -9, name
        ours, weights = attention(nested, nested, nested, need_weights=False)
    assert ours.is_nested and weights is None
    for sequence, expected in zip(ours.unbind(), exact_nested):
        assert sequence.dtype == HALF and _error(sequence, expected) <= 2 ** -6
    assert counts == {"packed": 2, "computed": 0, "attended": 4}
    assert _counted("torch._native_multi_head_attention") == "float16 computed in bfloat16"


def test_the_encoder_layers_probe_tells_a_program_nothing_of_its_own_nested_batch():
    """The probe at a program's first float16 encoder layer makes a nested batch of its own;
    torch's warning that nested tensors are a prototype (once a process) is not the program's,
    which may never make one. A new interpreter: the warning is shown once a process."""
    program = ("import warnings\n"
               "warnings.simplefilter('always')\n"
               "from cudashim.kernels import packed_encoder_layer, packed_linear\n"
               "print(packed_linear.unavailable() is None, packed_encoder_layer.unavailable())\n")
    result = python("-c", program, fresh=True)
    assert result.returncode == 0, result.stderr
    if result.stdout.split()[0] != "True":
        pytest.skip("linear layers do not pack here: encoder layers are not probed")
    assert result.stdout.split() == ["True", "None"]
    assert "nested tensors" not in result.stderr and "Warning" not in result.stderr, result.stderr


def test_an_encoder_layer_is_left_to_torchs_fused_call_where_op_by_op_cannot_take_it(speeds, monkeypatch):
    """A dense batch with a sequence padded whole (a query that attends to no key, which the fused
    call gives zeros) and a program that turned oneDNN off: torch's fused layer on bfloat16
    copies, the values a bfloat16 port computes, nothing packed."""
    import copy
    counts = _encoder_layers_counted(monkeypatch)
    torch.manual_seed(2)
    layer = torch.nn.TransformerEncoderLayer(32, 2, 64, batch_first=True)
    x = torch.randn(2, 6, 32).half()
    padding = torch.zeros(2, 6, dtype=torch.bool)
    padding[1] = True
    layer.half().eval()
    with torch.no_grad():
        port = copy.deepcopy(layer).bfloat16()
        expected = port(x.bfloat16(), src_key_padding_mask=padding).half()
        with torch.backends.mkldnn.flags(enabled=False):
            expected_without = port(x.bfloat16()).half()
    _bfloat16_products(speeds)
    with torch.no_grad():
        ours = layer(x, src_key_padding_mask=padding)
        torch.testing.assert_close(ours, expected, rtol=0, atol=0, equal_nan=True)
        with torch.backends.mkldnn.flags(enabled=False):
            assert torch.equal(layer(x), expected_without)
    assert counts == {"packed": 0, "computed": 0, "attended": 0}
    assert _counted("torch._transformer_encoder_layer_fwd") == "float16 computed in bfloat16"


def test_recurrent_layers_compute_float16_in_float32_and_train(speeds):
    """nn.LSTM, nn.GRU and nn.LSTMCell run torch._VF's fused ops, their products inside: where
    float16 is slow they compute in float32, as the same layers in float32 would, rounded to
    float16 once; a float16 LSTM trains, its gradients float16."""
    import copy
    torch.manual_seed(0)
    layers = {"torch._VF.lstm": torch.nn.LSTM(8, 12, 2, batch_first=True).half(),
              "torch._VF.gru": torch.nn.GRU(8, 12, batch_first=True).half(),
              "torch._VF.lstm_cell": torch.nn.LSTMCell(8, 12).half()}
    x = torch.randn(3, 5, 8).half()
    inputs = {"torch._VF.lstm": x, "torch._VF.gru": x, "torch._VF.lstm_cell": x[:, 0]}

    def outputs(layer, value):
        with torch.no_grad():
            result = layer(value)
        return [result[0], *result[1]] if isinstance(result[1], tuple) else list(result)
    wide = {name: outputs(copy.deepcopy(layer).float(), inputs[name].float()) for name, layer in layers.items()}
    speeds(SLOW_BOTH, report=True)
    for name, layer in layers.items():
        for ours, expected in zip(outputs(layer, inputs[name]), wide[name]):
            assert ours.dtype == HALF and torch.equal(ours, expected.half()), name
        assert _counted(name) == "float16 computed in float32", name
    lstm = layers["torch._VF.lstm"]
    lstm(x)[0].float().pow(2).mean().backward()
    assert all(p.grad is not None and p.grad.dtype == HALF and p.grad.abs().sum() > 0 for p in lstm.parameters())


def test_the_other_float16_ops_are_timed_both_ways_and_widened_only_where_float32_won():
    """Each op of the table is timed on its sample as asked and widened (conversions counted),
    and float32 is chosen only where it measured faster by the table's margin; the program's
    random numbers are not drawn from."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, FLOAT32
    from cudashim.tables.float16_ops import GROWN_SCALES, OPS, WIDEN_BELOW, places
    torch.manual_seed(7)
    expected_draw = torch.rand(1)
    torch.manual_seed(7)
    from cudashim.backends.timing import Stopwatch
    measured = cpu_speed._measure_ops(Stopwatch())
    assert torch.equal(torch.rand(1), expected_draw)
    assert set(measured) == {name for name in OPS if places(name)} and "pow" in measured
    for name, times in measured.items():
        assert times[AS_ASKED] > 0 and times[FLOAT32] > 0, name
        won = times[FLOAT32] < WIDEN_BELOW * times[AS_ASKED]
        assert times["choice"] == (FLOAT32 if won else AS_ASKED), (name, times)
        # a widened op is timed on grown samples too, the largest first; the others are not
        largest = max(GROWN_SCALES) * times["elements"]
        assert ("grown" in times) == won and (not won or largest in [size for size, *_ in times["grown"]]), times


def test_a_stall_through_one_pass_over_the_other_float16_ops_does_not_decide_their_choice():
    """The table is timed in passes, each op's best times over them deciding: a machine stalled
    through every turn of one op in one pass (both ways a hundred times their time, the widened
    way the more) chooses as the pass that ran unstalled, for good."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, FLOAT32
    timings = []

    def timed_both_ways(asked, widened, turns=7):
        timings.append((asked, widened))
        return [12.0, 36.0] if len(timings) == 1 else [0.2, 0.1]      # the first op's first pass

    measured = cpu_speed._measure_ops(TimedAs(timed_both_ways))
    first = next(iter(measured))
    assert {key: measured[first][key] for key in ("choice", AS_ASKED, FLOAT32)} == \
        {"choice": FLOAT32, AS_ASKED: 0.2, FLOAT32: 0.1}
    on_samples = [pair for pair in timings if pair[0].elements == measured[first]["elements"]]
    assert len(on_samples) == cpu_speed._OP_PASSES * len(measured) and cpu_speed._OP_PASSES > 1


def test_an_op_widened_on_its_sample_is_widened_only_up_to_the_size_it_still_wins_at(monkeypatch):
    """float32 can win on a sample the caches hold and lose past them (group_norm on a diffusion
    model's activations). A widened op is timed on its sample grown, the largest first, then
    bisected: widened up to the largest size at which float32 still won by the margin, as asked
    beyond; at every size where it won at the largest; and only on its sample where it lost at
    the smallest grown. An op kept as asked is not grown."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, FLOAT32
    from cudashim.tables import float16_ops
    # A sample of its own size for each op, so that a stopwatch answering by size knows the op.
    samples = {"group_norm": (2, 8), "pow": (3, 8), "normalize": (5, 8), "gelu": (7, 8)}
    monkeypatch.setattr(float16_ops, "SAMPLES", samples)
    monkeypatch.setattr(float16_ops, "OPS", {"group_norm": ("group_norm", (2,)), "pow": ("pow", (3.0,)),
                                             "normalize": ("normalize", (2.0, -1)), "gelu": ("gelu", ())})
    largest = max(float16_ops.GROWN_SCALES)
    float32_wins_up_to = {"group_norm": 4, "pow": largest, "normalize": 1, "gelu": 0}
    op_at = {rows * width * scale: (name, scale) for name, (rows, width) in samples.items()
             for scale in (1, *float16_ops.GROWN_SCALES)}
    grown = {name: [] for name in samples}

    def best_of_turns(asked, widened, turns=7):
        name, scale = op_at[asked.elements]
        assert widened.elements == asked.elements
        if scale > 1:
            grown[name].append(scale)
        won = scale <= float32_wins_up_to[name]
        return [1.0, float16_ops.WIDEN_BELOW - 0.05 if won else 1.0]

    measured = cpu_speed._measure_ops(TimedAs(best_of_turns))
    assert {name: times["choice"] for name, times in measured.items()} == \
        {"group_norm": FLOAT32, "pow": FLOAT32, "normalize": FLOAT32, "gelu": AS_ASKED}
    assert {name: cpu_speed._widened_up_to(times) for name, times in measured.items() if name != "gelu"} == \
        {"group_norm": 4 * 16, "pow": None, "normalize": 40}
    assert grown == {"group_norm": [largest, 4, 8], "pow": [largest], "normalize": [largest, 4, 2], "gelu": []}



def test_an_op_this_torch_computes_no_float16_of_is_left_out_of_the_table(monkeypatch):
    """torch 2.4 has no float16 grid_sample on the host ("grid_sampler_2d_cpu not implemented for
    Half"): timing it raised, and activation failed on every host where float16 is slow. An op
    whose float16 call raises is left out of the table (the kernel-gap group serves it); the
    others are timed as before."""
    from cudashim.backends import cpu_speed
    from cudashim.tables import float16_ops

    def refusing(x, *rest):
        if x.dtype is HALF:
            raise RuntimeError("refusing_op_cpu not implemented for 'Half'")
        return x * 2

    monkeypatch.setattr(F, "refusing_op", refusing, raising=False)
    monkeypatch.setattr(float16_ops, "SAMPLES", {"tokens": (2, 8)})
    monkeypatch.setattr(float16_ops, "OPS", {"refusing_op": ("tokens", ()), "gelu": ("tokens", ())})
    timed = []

    def best_of_turns(asked, widened, turns=7):
        timed.append(asked.elements)
        return [1.0, 1.0]

    measured = cpu_speed._measure_ops(TimedAs(best_of_turns))
    assert list(measured) == ["gelu"] and len(timed) == cpu_speed._OP_PASSES


def test_a_converting_choice_must_win_by_more_than_a_converting_call_costs():
    """Decoding-sized products, timed 0.08 ms as asked and 0.06 in bfloat16 (its conversions
    counted), stay as asked: the policy's converting path costs a call more than that in a
    program. Larger ones, where bfloat16 wins by milliseconds, are computed in bfloat16, from the
    first row count at which it wins by more than that cost."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32

    def timed_in_turns(*calls, turns=7):
        rows = len(calls) and timed_in_turns.rows.pop(0)
        scale = {2: 0.02, 4: 0.02}.get(rows, rows * 0.01)     # float16's time grows with the rows
        products = getattr(calls[0], "products", 1)          # a pass over weights streamed: a time each
        return [products * {AS_ASKED: 0.08 + scale, BFLOAT16: 0.06 + scale / 10, FLOAT32: 0.1 + scale / 5}[c]
                for c in timed_in_turns.order[len(calls)]]
    passes = cpu_speed._MATMUL_PASSES
    timed_in_turns.rows = [2] * passes + [256] * passes + [4, 8, 16, 32, 64, 128]
    timed_in_turns.order = {3: (AS_ASKED, BFLOAT16, FLOAT32), 2: (AS_ASKED, BFLOAT16)}
    measured = cpu_speed._measure_matmuls(TimedAs(timed_in_turns))
    assert (measured["memory_bound"], measured["compute_bound"]) == (AS_ASKED, BFLOAT16)
    # At 4 rows bfloat16 is timed 0.04 ms faster, at 8 0.07 ms: as asked up to 4.
    assert measured["memory_bound_rows"] == 4 and cpu_speed._CONVERTING_CALL_MS >= 0.05


def test_decoding_products_are_timed_on_weights_streamed_past_the_last_level_cache(tmp_path, monkeypatch):
    """The memory-bound class is timed as a decoder reads its weights, each once a pass, from a
    set holding more float32 than the cache a core reads through (sysfs says how large; 32 MiB
    where it does not; at most 256 MiB; the three choices' sets within a thirty-second of the
    memory): per product, the pass's time divided by its products."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32
    for level, size in enumerate(("48K", "2048K", "107520K")):
        (tmp_path / f"index{level}").mkdir()
        (tmp_path / f"index{level}" / "size").write_text(size + "\n")
    (tmp_path / "index9").mkdir()                           # a cache that says nothing
    monkeypatch.setattr(cpu_speed, "_CACHES", tmp_path)
    assert cpu_speed._last_level_cache_bytes() == 107520 * 2**10
    block_bytes = 4 * sum(out * into for out, into in cpu_speed._BLOCK_SHAPES)
    assert cpu_speed._streamed_blocks() == 3 and 3 * block_bytes > 107520 * 2**10 > 2 * block_bytes
    (tmp_path / "index3").mkdir()
    (tmp_path / "index3" / "size").write_text("1152M\n")    # a stacked cache: the set stays bounded
    assert cpu_speed._last_level_cache_bytes() == cpu_speed._LARGEST_CACHE == 256 * 2**20
    pages = {"SC_PHYS_PAGES": 2**30 // 4096, "SC_PAGE_SIZE": 4096}         # a machine of 1 GiB: at most
    monkeypatch.setattr(cpu_speed.os, "sysconf", pages.get)                # one block, whatever its cache
    assert cpu_speed._streamed_blocks() == 1
    pages["SC_PHYS_PAGES"] = 16 * 2**30 // 4096          # 16 GiB: 512 MiB, five blocks of the six
    assert cpu_speed._streamed_blocks() == 5
    monkeypatch.undo()
    monkeypatch.setattr(cpu_speed, "_CACHES", tmp_path / "absent")
    assert cpu_speed._last_level_cache_bytes() == 32 * 2**20 and cpu_speed._streamed_blocks() == 1

    passes = []

    def timed_in_turns(*calls, turns=7):
        passes.append([getattr(call, "products", 1) for call in calls])
        return [40.0, 20.0, 30.0]
    measured = cpu_speed._measure_matmuls(TimedAs(timed_in_turns))
    assert passes[0] == [4, 4, 4] and passes[-1] == [1, 1, 1]   # the compute-bound class: one weight
    assert measured["timings"]["memory-bound"] == {AS_ASKED: 10.0, BFLOAT16: 5.0, FLOAT32: 7.5, "rows": 2,
                                                   "streamed": "24 MB of float16 weights"}
    for choice in (AS_ASKED, BFLOAT16, FLOAT32):                  # each choice's pass runs here
        streamed = cpu_speed._streamed_call(2, choice)
        assert streamed.products == 4 and streamed() is None


def test_the_bfloat16_choice_is_timed_on_weights_packed_as_the_policy_keeps_them(monkeypatch, tmp_path):
    """The table times bfloat16 as the policy computes a linear layer in it: on weights packed
    for oneDNN where that runs here, each packed once before the turns; a table kept from before
    is timed again (the key asks only whether torch offers packing: the probe that it computes
    exactly waits for the first packed call). The other choices, and bfloat16 where nothing can
    be packed, time torch's own linear."""
    from cudashim.backends import cpu_speed
    from cudashim.kernels import packed_linear
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32
    counts = _packing_counted(monkeypatch)
    monkeypatch.setattr(cpu_speed, "_streamed_blocks", lambda: 1)
    for build in (cpu_speed._choice_call, cpu_speed._streamed_call):
        for choice in (AS_ASKED, FLOAT32):
            build(2, choice)()
    assert counts == {"packed": 0, "computed": 0}
    one, streamed = cpu_speed._choice_call(2, BFLOAT16), cpu_speed._streamed_call(2, BFLOAT16)
    assert counts == {"packed": 1 + 4, "computed": 0}
    one(), one(), streamed()
    assert counts == {"packed": 5, "computed": 2 + 4}
    monkeypatch.setenv("CUDASHIM_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cpu_speed, "speeds", lambda profile: (FAST_BF16, "test"))
    keys = []
    table = {"memory_bound": BFLOAT16, "compute_bound": BFLOAT16, "memory_bound_rows": 256, "timings": {}}
    monkeypatch.setattr(cpu_speed, "_cached", lambda path, key, measure: (keys.append(key), (table, "kept"))[1])
    probes = []
    monkeypatch.setattr(packed_linear, "unavailable", lambda: probes.append("probed"))
    cpu_speed.matmul_choices.cache_clear()
    cpu_speed.matmul_choices()
    assert not probes                                 # an activation computes no probe
    for reason in ("not_offered", "unavailable"):
        monkeypatch.setattr(packed_linear, reason, lambda: "this torch cannot pack")
    cpu_speed.matmul_choices.cache_clear()
    cpu_speed.matmul_choices()
    packed_key, plain_key = keys[0], keys[2]          # each: the matmuls' table, then attention's
    assert packed_key == plain_key + ", bfloat16 on weights packed for oneDNN"
    cpu_speed._choice_call(2, BFLOAT16)()
    assert counts == {"packed": 5, "computed": 6}


def test_a_decoding_choice_that_keeps_a_second_copy_of_every_weight_must_win_by_more():
    """A float32 decoding beside a bfloat16 prefill keeps a float32 copy of each weight beside the
    bfloat16 one: timed 5% faster than bfloat16 per product it is not chosen; 30% faster, it is.
    Attention keeps no weights, so its choices are timed as they run."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32

    def table(float32_at_two_rows):
        def timed_in_turns(*calls, turns=7):
            products = getattr(calls[0], "products", 1)
            if products > 1:                                # the memory-bound class, or the boundary
                times = {AS_ASKED: 2.0, BFLOAT16: 1.0, FLOAT32: float32_at_two_rows}
                return [products * times[choice] for choice in timed_in_turns.order(len(calls))]
            return [4.0, 1.0, 3.0]                          # the compute-bound class: bfloat16
        timed_in_turns.order = lambda n: (AS_ASKED, BFLOAT16, FLOAT32) if n == 3 else (FLOAT32, BFLOAT16)
        return cpu_speed._measure_classes(TimedAs(timed_in_turns), cpu_speed._choice_call,
                                          streamed=lambda rows, choice: _Passing(products=4))

    nearly = table(0.95)
    assert (nearly["memory_bound"], nearly["compute_bound"]) == (BFLOAT16, BFLOAT16)
    assert nearly["memory_bound_rows"] == cpu_speed._COMPUTE_BOUND_ROWS
    clearly = table(0.65)
    assert (clearly["memory_bound"], clearly["compute_bound"]) == (FLOAT32, BFLOAT16)
    # without weights to keep, float32 5% faster is chosen: the more precise within the margin
    assert cpu_speed._fastest({AS_ASKED: 2.0, BFLOAT16: 1.0, FLOAT32: 0.95}) == FLOAT32
    assert cpu_speed._fastest({AS_ASKED: 2.0, BFLOAT16: 1.0, FLOAT32: 0.95}, BFLOAT16) == BFLOAT16


class _Passing:
    """A call of ``products`` products that computes nothing."""

    def __init__(self, products):
        self.products = products

    def __call__(self):
        return None


def test_a_stall_through_one_pass_over_a_matmul_shape_class_does_not_decide_its_choice():
    """Each shape class of the float16 matmul table is timed in passes, each choice's best time
    over them deciding: a machine stalled through every turn of the compute-bound class's first
    pass (every choice a hundred times its time) chooses as the pass that ran unstalled."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32
    passes = []

    def timed_in_turns(*calls, turns=7):
        passes.append(len(calls))
        if len(passes) == cpu_speed._MATMUL_PASSES + 1:           # the compute-bound class's first
            return [4500.0, 9000.0, 9000.0]
        return [45.0, 32.0, 42.0][:len(calls)]

    measured = cpu_speed._measure_matmuls(TimedAs(timed_in_turns))
    assert measured["compute_bound"] == BFLOAT16
    assert measured["timings"]["compute-bound"] == {AS_ASKED: 45.0, BFLOAT16: 32.0, FLOAT32: 42.0,
                                                    "rows": 256}
    assert passes[:2 * cpu_speed._MATMUL_PASSES] == [3] * 2 * cpu_speed._MATMUL_PASSES
    assert cpu_speed._MATMUL_PASSES > 1


def test_an_op_cached_as_widened_near_a_tie_is_read_as_asked(monkeypatch):
    """The choice is decided from the cached timings on every read, at today's margin: a table
    timed when a near tie was widened (gelu at 0.8 of float16's time) now keeps that op as
    asked, and one that wins by far (pow at 0.15) stays widened."""
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, FLOAT32
    from cudashim.tables.float16_ops import WIDEN_BELOW
    grown = [[2**20, 0.9, 0.2], [2**23, 6.0, 7.0]]             # widened up to 2^20 elements
    cached = {"gelu": {"choice": FLOAT32, AS_ASKED: 0.2, FLOAT32: 0.16, "elements": 2**19, "grown": grown},
              "pow": {"choice": FLOAT32, AS_ASKED: 0.43, FLOAT32: 0.065, "elements": 2**19, "grown": grown}}
    monkeypatch.setattr(cpu_speed, "speeds", lambda profile: ({HALF: False, BF16: True}, "test"))
    monkeypatch.setattr(cpu_speed, "_cached", lambda path, key, measure: (cached, "cached in test"))
    read = cpu_speed.op_choices.__wrapped__(cpu_speed.MEASURED)
    assert WIDEN_BELOW < 0.8
    assert read == {"gelu": {**cached["gelu"], "choice": AS_ASKED, "widened_up_to": None},
                    "pow": {**cached["pow"], "choice": FLOAT32, "widened_up_to": 2**20}}


def _timed(choice):
    from cudashim.precision import AS_ASKED, FLOAT32
    return {"choice": choice, AS_ASKED: 2.0 if choice == FLOAT32 else 1.0, FLOAT32: 1.5}


def test_an_op_timed_faster_in_float32_is_computed_there_and_the_others_are_left_alone(speeds):
    """Where the host timed group_norm and softmax faster in float32 and layer_norm faster as
    asked: the first two compute float16 in float32, rounded once, through the functions and
    the modules that call them; layer_norm is torch's own function, not a wrapper; a call asking
    for an output dtype, or on float32, is torch's; doctor says which is which."""
    import cudashim
    from cudashim.precision import AS_ASKED, FLOAT32
    torch.manual_seed(0)
    x = torch.randn(2, 8, 6, 6).half()
    norm = torch.nn.GroupNorm(4, 8).half()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
    own = {name: getattr(F, name) for name in ("group_norm", "softmax", "layer_norm")}
    expected = {"group_norm": F.group_norm(x.float(), 4).half(),
                "module": F.group_norm(x.float(), 4, norm.weight.float(), norm.bias.float()).half(),
                "softmax": F.softmax(x.float(), -1).half(), "as float32": F.softmax(x, -1, dtype=torch.float32),
                "float32 input": F.group_norm(x.float(), 4), "layer_norm": F.layer_norm(x, (6,)),
                "as float32, positionally": F.softmax(x, -1, dtype=torch.float32)}
    speeds(SLOW_BOTH, ops={"group_norm": _timed(FLOAT32), "softmax": _timed(FLOAT32),
                           "layer_norm": _timed(AS_ASKED)}, report=True)
    assert F.layer_norm is own["layer_norm"]
    assert F.group_norm is not own["group_norm"] and F.softmax is not own["softmax"]
    got = {"group_norm": F.group_norm(x, 4), "module": norm(x), "softmax": F.softmax(x, -1),
           "as float32": F.softmax(x, -1, dtype=torch.float32), "float32 input": F.group_norm(x.float(), 4),
           "as float32, positionally": F.softmax(x, -1, 3, torch.float32),
           "layer_norm": F.layer_norm(x, (6,))}
    for name, value in got.items():
        assert value.dtype == expected[name].dtype and torch.equal(value, expected[name]), name
    with torch.no_grad():                       # the second call from the weights' kept copies
        assert all(torch.equal(norm(x), expected["module"]) for _ in range(2))
    assert _counted("torch.nn.functional.group_norm") == "float16 computed in float32 (measured faster here)"
    assert _counted("torch.nn.functional.softmax") == "float16 computed in float32 (measured faster here)"
    table = "\n".join(cudashim.activation.current_activation().precision.describe())
    assert "as asked: layer_norm (as-asked 1 ms, float32 1.5 ms)" in table, table
    assert "in float32, rounded to float16 once: group_norm (as-asked 2 ms, float32 1.5 ms), softmax" in table, table
    cudashim.deactivate()
    assert all(getattr(F, name) is function for name, function in own.items())


def test_an_op_widened_up_to_a_size_runs_as_asked_on_larger_inputs(speeds):
    """group_norm timed faster in float32 up to 2 x 8 x 6 x 6 elements and slower at twice that:
    an input of that size is computed in float32 and rounded once, through the function and the
    module; a larger one is torch's own float16 kernel, and the report says which it became
    (torch's CPU kernel computes float16 in float32 too: the results match either way);
    doctor says up to which size."""
    import cudashim
    from cudashim.precision import FLOAT32
    torch.manual_seed(0)
    own = F.group_norm
    x, larger = torch.randn(2, 8, 6, 6).half(), torch.randn(3, 8, 6, 6).half()
    norm = torch.nn.GroupNorm(4, 8).half()
    timed = {**_timed(FLOAT32), "elements": x.numel(), "grown": [[2 * x.numel(), 1.0, 1.5]],
             "widened_up_to": x.numel()}
    speeds(SLOW_BOTH, ops={"group_norm": timed}, report=True)
    with torch.no_grad():                       # the report keeps what an API's first call became
        assert torch.equal(norm(larger), own(larger, 4, norm.weight, norm.bias))
    assert torch.equal(F.group_norm(larger, 4), own(larger, 4))
    assert _counted("torch.nn.functional.group_norm") == \
        "float16 as asked (larger than float32 was timed faster at here)"
    cudashim.deactivate()
    speeds(SLOW_BOTH, ops={"group_norm": timed}, report=True)
    with torch.no_grad():
        assert torch.equal(norm(x), own(x.float(), 4, norm.weight.float(), norm.bias.float()).half())
    assert torch.equal(F.group_norm(x, 4), own(x.float(), 4).half())
    assert _counted("torch.nn.functional.group_norm") == "float16 computed in float32 (measured faster here)"
    table = "\n".join(cudashim.activation.current_activation().precision.describe())
    assert "group_norm (as-asked 2 ms, float32 1.5 ms; up to 576 elements, as asked beyond " \
           "(at 1,152: as-asked 1 ms, float32 1.5 ms))" in table, table


def test_a_power_timed_faster_in_float32_is_computed_there_by_every_name_it_is_called(speeds):
    """pow is reached as torch.pow, x.pow, x ** n and square: each computes float16 in float32,
    rounded once; an out= tensor receives it, gradients flow back in float16, float32 calls
    and a float32 exponent are torch's, and deactivation gives torch's own back."""
    import cudashim
    from cudashim.precision import FLOAT32
    torch.manual_seed(0)
    x = torch.randn(4, 16).half()
    own = {name: vars(torch.Tensor).get(name, getattr(torch.Tensor, name))
           for name in ("pow", "__pow__", "square")}
    cube, square = (x.float() ** 3).half(), (x.float() ** 2).half()
    mixed = x.pow(torch.full((16,), 2.0))                          # promoted to float32 by torch
    speeds(SLOW_BOTH, ops={"pow": _timed(FLOAT32)}, report=True)
    for name, value, expected in (("torch.pow", torch.pow(x, 3.0), cube), ("Tensor.pow", x.pow(3), cube),
                                  ("Tensor.__pow__", x ** 2, square), ("torch.square", torch.square(x), square),
                                  ("Tensor.square", x.square(), square)):
        assert value.dtype == HALF and torch.equal(value, expected), name
        assert _counted(name) == "float16 computed in float32 (measured faster here)", name
    out = torch.empty(4, 16, dtype=HALF)
    assert torch.pow(x, 3.0, out=out) is out and torch.equal(out, cube)
    assert torch.equal(x.pow(torch.full((16,), 2.0)), mixed) and (x.float() ** 2).dtype == torch.float32
    leaf = x.clone().requires_grad_()
    (leaf ** 3).float().sum().backward()
    assert leaf.grad.dtype == HALF and torch.allclose(leaf.grad.float(), 3 * x.float() ** 2, rtol=1e-3)
    cudashim.deactivate()
    assert all(vars(torch.Tensor).get(name, getattr(torch.Tensor, name)) is function
               for name, function in own.items())


def test_argmax_argmin_and_max_pool1d_timed_faster_in_float32_keep_their_indices(speeds):
    """Greedy decoding's argmax over float16 logits, argmin, and a 1-D convnet's max_pool1d, where
    the host timed them faster in float32: each name they are called by computes there, and the
    indices are the float16 call's own (int64, ties to the first index), values rounded once
    where there are values (max_pool1d's, with its indices where asked for); gradients flow back
    in float16; deactivation gives torch's own back."""
    import cudashim
    from cudashim.precision import FLOAT32
    torch.manual_seed(3)
    logits = torch.randn(4, 50).half()
    logits[1, 7] = logits[1, 30] = logits[1].max() + 1        # a tie: the first index wins
    signal = torch.randn(2, 3, 17).half()
    own = {name: vars(torch.Tensor).get(name, getattr(torch.Tensor, name)) for name in ("argmax", "argmin")}
    expected = {"argmax": logits.float().argmax(-1), "argmin": logits.float().argmin(-1),
                "pooled": F.max_pool1d(signal.float(), 3, 2)}
    with pytest.raises(RuntimeError) as refused:
        F.max_pool1d(signal, 0)
    speeds(SLOW_BOTH, ops={name: _timed(FLOAT32) for name in ("argmax", "argmin", "max_pool1d")}, report=True)
    calls = {"torch.argmax": torch.argmax(logits, dim=-1), "Tensor.argmax": logits.argmax(-1),
             "torch.argmin": torch.argmin(logits, -1), "Tensor.argmin": logits.argmin(dim=-1)}
    for name, indices in calls.items():
        assert indices.dtype == torch.int64 and torch.equal(indices, expected[name.split(".")[1]]), name
        assert _counted(name) == "float16 computed in float32 (measured faster here)", name
    assert calls["Tensor.argmax"][1] == 7
    assert logits.argmax().item() == logits.float().argmax().item()
    assert torch.equal(logits.argmax(-1, keepdim=True), expected["argmax"].unsqueeze(-1))
    pooled, where = F.max_pool1d(signal, 3, 2, return_indices=True)
    assert pooled.dtype == HALF and torch.equal(pooled, expected["pooled"].half())
    assert where.dtype == torch.int64 and torch.equal(where, F.max_pool1d(signal.float(), 3, 2, return_indices=True)[1])
    assert torch.equal(torch.nn.MaxPool1d(3, 2)(signal), pooled)
    assert _counted("torch.nn.functional.max_pool1d") == "float16 computed in float32 (measured faster here)"
    leaf = signal.clone().requires_grad_()
    F.max_pool1d(leaf, 3, 2).float().sum().backward()
    assert leaf.grad.dtype == HALF and leaf.grad.sum().item() == pooled.numel()
    with pytest.raises(RuntimeError) as ours_refused:
        F.max_pool1d(signal, 0)
    assert str(ours_refused.value) == str(refused.value)
    cudashim.deactivate()
    assert all(vars(torch.Tensor).get(name, getattr(torch.Tensor, name)) is function
               for name, function in own.items())


def test_grid_sample_and_flip_are_widened_only_in_the_calls_of_the_kind_timed_faster(speeds):
    """Where the host timed bilinear grid_sample (deformable attention's sampling) and a flip of
    the last dimension faster in float32: those calls compute there, rounded once, by every name
    and argument form; nearest sampling, volumetric sampling and flips of leading dimensions,
    which torch computes faster as asked, are torch's own calls, values and layouts alike;
    gradients flow back to float16 values and grids."""
    import cudashim
    from cudashim.precision import FLOAT32
    torch.manual_seed(11)
    values, grid = torch.randn(2, 3, 9, 11).half(), (torch.rand(2, 5, 7, 2) * 2 - 1).half()
    volume, grid3 = torch.randn(1, 2, 4, 5, 6).half(), (torch.rand(1, 3, 3, 3, 3) * 2 - 1).half()
    tokens = torch.randn(3, 4, 5).half()
    images = torch.randn(2, 3, 4, 5).half().to(memory_format=torch.channels_last)
    own = {"nearest": F.grid_sample(values, grid, "nearest", align_corners=False),
           "bilinear": F.grid_sample(values, grid, align_corners=False),
           "volume": F.grid_sample(volume, grid3, align_corners=False)}
    wide = F.grid_sample(values.float(), grid.float(), align_corners=False).half()
    assert not torch.equal(own["bilinear"], wide)           # the two ways are told apart by value
    own_flip = torch.Tensor.flip
    speeds(SLOW_BOTH, ops={name: _timed(FLOAT32) for name in ("grid_sample", "flip")}, report=True)
    nearest = F.grid_sample(values, grid, "nearest", align_corners=False)     # the first call counted
    assert torch.equal(nearest, own["nearest"])
    assert _counted("torch.nn.functional.grid_sample").startswith("float16 as asked")
    assert torch.equal(F.grid_sample(values, grid, mode="nearest", align_corners=False), own["nearest"])
    assert torch.equal(F.grid_sample(volume, grid3, align_corners=False), own["volume"])
    for call in (lambda: F.grid_sample(values, grid, align_corners=False),
                 lambda: F.grid_sample(values, grid, "bilinear", "zeros", False),
                 lambda: F.grid_sample(values, grid=grid, mode="bilinear", align_corners=False)):
        sampled = call()
        assert sampled.dtype == HALF and torch.equal(sampled, wide)
    leaf, where = values.clone().requires_grad_(), grid.clone().requires_grad_()
    F.grid_sample(leaf, where, align_corners=False).float().sum().backward()
    assert leaf.grad.dtype == where.grad.dtype == HALF and leaf.grad.abs().sum() > 0 and where.grad.abs().sum() > 0

    flips = {"Tensor.flip": (lambda: tokens.flip(-1), tokens.float().flip(-1)),
             "torch.flip": (lambda: torch.flip(tokens, dims=(0, 2)), tokens.float().flip(0, 2))}
    for name, (call, expected) in flips.items():
        flipped = call()
        assert flipped.dtype == HALF and torch.equal(flipped, expected.half()), name
        assert _counted(name) == "float16 computed in float32 (measured faster here)", name
    assert torch.equal(tokens.flip(0, 2), flips["torch.flip"][1].half())
    assert torch.equal(tokens.flip([2]), flips["Tensor.flip"][1].half())
    mirrored = images.flip(-1)
    assert mirrored.stride() == own_flip(images, [-1]).stride() and torch.equal(mirrored, own_flip(images, [-1]))
    leading = tokens.flip(0)
    assert torch.equal(leading, own_flip(tokens, [0]))
    cudashim.deactivate()
    assert torch.Tensor.flip is own_flip


def _became(name, call):
    """``call()``'s result and what its call of ``name`` became (the report keeps a name's first)."""
    import cudashim.activation as activation
    entries = activation.current_activation().report.entries
    entries.pop(name, None)
    return call(), entries[name]["became"]


WIDENED, KEPT = "float16 computed in float32 (measured faster here)", "float16 as asked (a kind of call"


def test_reductions_and_powers_are_widened_only_over_the_dimension_and_exponent_timed(speeds):
    """Where the host timed softmax, argmax, norms and cosine similarities over the last
    dimension, pow(x, 3) and bilinear upsampling faster in float32: calls of those kinds, by
    every argument form, compute there; a reduction over a leading dimension, a 1-norm, an
    exponent float32 computes element by element too, nearest resizing and bilinear
    downsampling without antialiasing are torch's own calls (each measured slower widened on an
    AVX512-BF16 EPYC), their values torch's exactly."""
    from cudashim.precision import FLOAT32
    torch.manual_seed(3)
    x, y = torch.randn(3, 5, 16).half(), torch.randn(3, 5, 16).half()
    rows, positive = torch.randn(6, 16).half(), torch.rand(3, 5, 16).half() + 0.5
    images = torch.randn(2, 3, 6, 7).half()
    exponents = torch.full((16,), 2.0).half()
    # name: [(the call, widened: what float32 gives rounded once, or None: torch's own call)]
    calls = {
        "torch.nn.functional.softmax": [
            (lambda: F.softmax(x, -1), lambda: F.softmax(x.float(), -1)),
            (lambda: F.softmax(x, dim=2), lambda: F.softmax(x.float(), 2)),
            (lambda: F.softmax(x, 1), None),
            (lambda: torch.nn.Softmax(dim=0)(x), None)],
        "torch.nn.functional.log_softmax": [
            (lambda: F.log_softmax(x, dim=-1), lambda: F.log_softmax(x.float(), -1)),
            (lambda: F.log_softmax(x, 0), None)],
        "Tensor.argmax": [
            (lambda: x.argmax(-1), lambda: x.float().argmax(-1)),
            (lambda: x.argmax(), lambda: x.float().argmax()),
            (lambda: x.argmax(1), None)],
        "torch.argmin": [
            (lambda: torch.argmin(x, dim=2, keepdim=True), lambda: x.float().argmin(2, True)),
            (lambda: torch.argmin(x, 0), None)],
        "torch.linalg.vector_norm": [
            (lambda: torch.linalg.vector_norm(x, dim=-1), lambda: x.float().norm(dim=-1)),
            (lambda: x.norm(dim=(2, 1)), lambda: x.float().norm(dim=(1, 2))),
            (lambda: torch.norm(x), lambda: x.float().norm()),
            (lambda: torch.linalg.vector_norm(x, 2, 0), None),
            (lambda: torch.linalg.vector_norm(x, 2, (0, 2)), None),
            (lambda: torch.linalg.vector_norm(x, ord=1, dim=-1), None),
            (lambda: x.norm(float("inf"), -1), None)],
        "torch.nn.functional.normalize": [
            (lambda: F.normalize(rows), lambda: F.normalize(rows.float())),
            (lambda: F.normalize(x, dim=-1), lambda: F.normalize(x.float(), dim=-1)),
            (lambda: F.normalize(x), None),
            (lambda: F.normalize(x, 1.0, -1), None)],
        "torch.nn.functional.cosine_similarity": [
            (lambda: torch.nn.CosineSimilarity()(rows, rows.flip(0)),
             lambda: F.cosine_similarity(rows.float(), rows.flip(0).float())),
            (lambda: F.cosine_similarity(x, y, -1), lambda: F.cosine_similarity(x.float(), y.float(), -1)),
            (lambda: F.cosine_similarity(x, y), None)],
        "Tensor.__pow__": [
            (lambda: positive ** 2, lambda: positive.float() ** 2),
            (lambda: positive ** 4, None),
            (lambda: positive ** 1, None)],
        "torch.pow": [
            (lambda: torch.pow(positive, exponent=-0.5), lambda: positive.float() ** -0.5),
            (lambda: torch.pow(positive, 1.5), None),
            (lambda: torch.pow(positive, exponents), None)],
        "Tensor.pow": [(lambda: positive.pow(3), lambda: positive.float().pow(3))],
        "torch.square": [(lambda: torch.square(positive), lambda: positive.float() ** 2)],
        "torch.nn.functional.interpolate": [
            (lambda: F.interpolate(images, scale_factor=2.0, mode="bilinear"),
             lambda: F.interpolate(images.float(), scale_factor=2.0, mode="bilinear")),
            (lambda: F.interpolate(images, size=(3, 4), mode="bilinear", antialias=True),
             lambda: F.interpolate(images.float(), size=(3, 4), mode="bilinear", antialias=True)),
            (lambda: F.interpolate(images, size=(12, 7), mode="bilinear", align_corners=True),
             lambda: F.interpolate(images.float(), size=(12, 7), mode="bilinear", align_corners=True)),
            (lambda: F.interpolate(images, scale_factor=2.0), None),
            (lambda: F.interpolate(images, scale_factor=0.5, mode="bilinear"), None),
            (lambda: F.interpolate(images, size=(3, 14), mode="bilinear"), None),
            (lambda: F.interpolate(x, scale_factor=2.0, mode="linear"), None)],
    }
    own = {(name, index): call() for name, forms in calls.items()
           for index, (call, widened) in enumerate(forms) if widened is None}
    timed = ("softmax", "log_softmax", "argmax", "argmin", "vector_norm", "normalize", "cosine_similarity",
             "pow", "interpolate")
    speeds(SLOW_BOTH, ops={name: _timed(FLOAT32) for name in timed}, report=True)
    for name, forms in calls.items():
        for index, (call, widened) in enumerate(forms):
            result, became = _became(name, call)
            where = f"{name}, form {index}"
            if widened is None:
                assert became.startswith(KEPT), where
                assert torch.equal(result, own[name, index]), where
            else:
                expected = widened()
                expected = expected.half() if expected.is_floating_point() else expected
                assert became == WIDENED, where
                assert result.dtype == expected.dtype and torch.equal(result, expected), where


def test_a_float16_call_naming_its_tensors_by_keyword_is_computed_as_the_positional_one(speeds):
    """``F.linear(input=x, weight=w)``, ``F.scaled_dot_product_attention(query=q, key=k,
    value=v)``, ``F.softmax(input=x, dim=-1)``, torch's NumPy names (``x=``) and a list of
    operands by keyword compute as their positional forms do where the policy widens them;
    a keyword call of a kind timed faster as asked stays torch's own, a float32 one is torch's
    call, and a call without its leading tensor fails as torch's does."""
    from cudashim.precision import FLOAT32, MatmulChoices
    torch.manual_seed(4)
    x, y, w, b = (torch.randn(*shape).half() for shape in ((3, 5, 16), (3, 5, 16), (8, 16), (8,)))
    m, images, kernel = torch.randn(16, 4).half(), torch.randn(2, 3, 6, 7).half(), torch.randn(4, 3, 3, 3).half()
    q, k, v = (torch.randn(2, 4, 6, 8).half() for _ in range(3))
    positive = torch.rand(3, 5, 16).half() + 0.5
    # name: [(by keyword, by position, what float32 gives rounded once; None: torch's own call)]
    calls = {
        "torch.nn.functional.linear": [
            (lambda: F.linear(input=x, weight=w, bias=b), lambda: F.linear(x, w, b),
             lambda: F.linear(x.float(), w.float(), b.float())),
            (lambda: F.linear(x=x, weight=w), lambda: F.linear(x, w), lambda: F.linear(x.float(), w.float()))],
        "torch.matmul": [(lambda: torch.matmul(input=x, other=m), lambda: torch.matmul(x, m),
                          lambda: x.float() @ m.float())],
        "torch.nn.functional.conv2d": [(lambda: F.conv2d(input=images, weight=kernel, padding=1),
                                        lambda: F.conv2d(images, kernel, padding=1),
                                        lambda: F.conv2d(images.float(), kernel.float(), padding=1))],
        "torch.nn.functional.scaled_dot_product_attention": [
            (lambda: F.scaled_dot_product_attention(query=q, key=k, value=v, is_causal=True),
             lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
             lambda: F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True))],
        "torch.linalg.multi_dot": [(lambda: torch.linalg.multi_dot(tensors=[x[0], m]),
                                    lambda: torch.linalg.multi_dot([x[0], m]), lambda: x[0].float() @ m.float())],
        "torch.nn.functional.softmax": [
            (lambda: F.softmax(input=x, dim=-1), lambda: F.softmax(x, -1), lambda: F.softmax(x.float(), -1)),
            (lambda: F.softmax(input=x, dim=0), lambda: F.softmax(x, 0), None)],
        "torch.linalg.vector_norm": [(lambda: torch.linalg.vector_norm(x=x, dim=-1),
                                      lambda: torch.linalg.vector_norm(x, dim=-1), lambda: x.float().norm(dim=-1))],
        "torch.nn.functional.cosine_similarity": [
            (lambda: F.cosine_similarity(x1=x, x2=y, dim=-1), lambda: F.cosine_similarity(x, y, -1),
             lambda: F.cosine_similarity(x.float(), y.float(), -1))],
        "torch.pow": [(lambda: torch.pow(input=positive, exponent=2), lambda: torch.pow(positive, 2),
                       lambda: positive.float() ** 2)],
    }
    own = {(name, index): by_keyword() for name, forms in calls.items()
           for index, (by_keyword, _, widened) in enumerate(forms) if widened is None}
    speeds(SLOW_BOTH, matmuls=MatmulChoices(FLOAT32, FLOAT32, 4, "test"),
           ops={name: _timed(FLOAT32) for name in ("softmax", "vector_norm", "cosine_similarity", "pow")},
           report=True)
    for name, forms in calls.items():
        for index, (by_keyword, by_position, widened) in enumerate(forms):
            where = f"{name}, form {index}"
            result, became = _became(name, by_keyword)
            assert (result.dtype, became) == (HALF, _became(name, by_position)[1]), where
            if widened is None:
                assert became.startswith(KEPT) and torch.equal(result, own[name, index]), where
            else:
                assert became.startswith("float16 computed in float32"), where
                assert torch.equal(result, widened().half()), where
    wide = x.float()
    assert torch.equal(F.linear(input=wide, weight=w.float()), F.linear(wide, w.float()))
    with pytest.raises(TypeError, match="input"):
        F.linear(weight=w)


def test_norms_and_cosine_similarities_timed_faster_in_float32_are_computed_there_by_every_name(speeds):
    """Where the host timed float16 vector norms and cosine similarities faster in float32:
    torch.linalg.vector_norm, torch.norm and Tensor.norm (which reach it), nn.CosineSimilarity
    and F.normalize's norm compute in float32, each result rounded once (what torch's float16
    kernels, which accumulate in float32, return); a norm long enough for the exact reductions
    is as near float64's as as asked; gradients flow back in float16."""
    from cudashim.precision import FLOAT32
    torch.manual_seed(5)
    x, y = torch.randn(3, 40, 64).half(), torch.randn(3, 40, 64).half()
    long = torch.randn(2 ** 21).half()
    norms = x.float().norm(dim=-1).half()
    expected = {"torch.linalg.vector_norm": norms, "torch.norm": norms, "Tensor.norm": norms,
                "whole": x.float().norm().half(), "cosine": F.cosine_similarity(x.float(), y.float(), -1).half(),
                "normalize": F.normalize(x, dim=-1)}
    exact = long.double().norm()
    as_asked_error = (long.norm().double() - exact).abs()
    speeds(SLOW_BOTH, ops={name: _timed(FLOAT32) for name in ("vector_norm", "cosine_similarity")}, report=True)
    calls = {"torch.linalg.vector_norm": torch.linalg.vector_norm(x, dim=-1), "torch.norm": torch.norm(x, 2, -1),
             "Tensor.norm": x.norm(dim=-1), "whole": x.norm(),
             "cosine": torch.nn.CosineSimilarity(dim=-1)(x, y), "normalize": F.normalize(x, dim=-1)}
    for name, value in calls.items():
        assert value.dtype == HALF and torch.equal(value, expected[name]), name
    assert _counted("torch.linalg.vector_norm") == "float16 computed in float32 (measured faster here)"
    assert _counted("torch.nn.functional.cosine_similarity") == "float16 computed in float32 (measured faster here)"
    ours = long.norm()
    assert ours.dtype == HALF and (ours.double() - exact).abs() <= max(as_asked_error, exact * 2 ** -11)
    leaf = x.clone().requires_grad_()
    leaf.norm(dim=-1).float().sum().backward()
    assert leaf.grad.dtype == HALF
    torch.testing.assert_close(leaf.grad.float(), (x.float() / x.float().norm(dim=-1, keepdim=True)),
                               rtol=2 ** -9, atol=2 ** -12)


def _scripted_products(x: torch.Tensor, w: torch.Tensor):
    return torch.tensordot(x, w, dims=1) + torch.cdist(x, w) + F.normalize(x, dim=-1) + torch.inner(x, w)


def test_torchscript_compiles_the_replaced_functions_as_torchs_own(speeds):
    """Scripted code calling torch's Python functions the policy replaced (nn.GroupNorm's
    F.group_norm, torch.tensordot, torch.cdist, F.normalize) compiles them from torch's source
    into the graph, as without cudashim: no Python call left in it, and it saves."""
    import io
    from cudashim.precision import FLOAT32
    torch.manual_seed(0)
    norm, x = torch.nn.GroupNorm(2, 4), torch.randn(2, 4, 3, 3)
    expected = {"norm": norm(x), "products": _scripted_products(x[0, 0], x[1, 0])}
    own = (F.group_norm, F.normalize, torch.tensordot, torch.cdist)
    speeds(SLOW_BOTH, ops={"group_norm": _timed(FLOAT32), "normalize": _timed(FLOAT32)})
    assert not any(replaced is original for replaced, original in zip(
        (F.group_norm, F.normalize, torch.tensordot, torch.cdist), own))
    scripted = {"norm": torch.jit.script(norm), "products": torch.jit.script(_scripted_products)}
    for name, compiled in scripted.items():
        assert "prim::PythonOp" not in str(compiled.graph), (name, compiled.graph)
        torch.jit.save(compiled, io.BytesIO())
    assert torch.allclose(scripted["norm"](x), expected["norm"], atol=1e-6)
    assert torch.allclose(scripted["products"](x[0, 0], x[1, 0]), expected["products"], atol=1e-5)


def test_a_model_holding_a_widened_function_is_copied_and_saved_whole(speeds):
    """nn.TransformerEncoderLayer keeps F.gelu as its activation, and its encoder deep-copies
    the layer; torch.save(model) pickles it whole. Where gelu is widened the copies hold the
    same function, and the pickle holds torch's own, so it loads without cudashim."""
    import copy
    import io
    import cudashim
    from cudashim import speedups
    from cudashim.precision import FLOAT32
    if speedups.chosen(cudashim._settings.load()) is None:
        pytest.skip("the compiled fast path does not run here: the pure-Python wrappers are "
                    "functions, which pickle by their name")
    own_gelu = F.gelu
    speeds(SLOW_BOTH, ops={"gelu": _timed(FLOAT32)})
    assert F.gelu is not own_gelu and copy.deepcopy(F.gelu) is F.gelu and copy.copy(F.gelu) is own_gelu
    layer = torch.nn.TransformerEncoderLayer(16, 2, 32, activation="gelu", batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).half()
    assert all(block.activation is F.gelu for block in encoder.layers)
    saved = io.BytesIO()
    torch.save(encoder, saved)
    saved.seek(0)
    loaded = torch.load(saved, weights_only=False)
    assert all(block.activation is own_gelu for block in loaded.layers)
    x = torch.randn(2, 5, 16).half()
    assert torch.equal(loaded.eval()(x), encoder.eval()(x))


def test_deactivation_puts_the_family_back():
    import cudashim
    originals = (torch.mm, torch.Tensor.__matmul__, F.linear, F.scaled_dot_product_attention,
                 torch._native_multi_head_attention, torch._transformer_encoder_layer_fwd, torch._VF.lstm)
    cudashim.activate("cpu")
    cudashim.deactivate()
    assert (torch.mm, torch.Tensor.__matmul__, F.linear, F.scaled_dot_product_attention,
            torch._native_multi_head_attention, torch._transformer_encoder_layer_fwd, torch._VF.lstm) == originals
    assert "lstm" not in vars(torch._VF)                  # looked up through the module again


@needs_onednn_precision
def test_tf32_flags_turn_the_targets_reduced_precision_matmul_on_and_off(speeds):
    mkldnn = torch.backends.mkldnn
    before = (mkldnn.matmul.fp32_precision, mkldnn.conv.fp32_precision)
    matmul_flags = torch.backends.cuda.matmul
    speeds(FAST_BF16)
    torch.backends.cuda.matmul.allow_tf32 = True
    assert mkldnn.matmul.fp32_precision == "bf16" and torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    assert mkldnn.matmul.fp32_precision == before[0] and not torch.backends.cuda.matmul.allow_tf32
    torch.set_float32_matmul_precision("high")
    assert mkldnn.matmul.fp32_precision == "bf16"
    torch.set_float32_matmul_precision("highest")
    assert mkldnn.matmul.fp32_precision == before[0]
    torch.backends.cudnn.allow_tf32 = True
    assert mkldnn.conv.fp32_precision == "bf16" and torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = True
    import cudashim
    cudashim.deactivate()
    assert (mkldnn.matmul.fp32_precision, mkldnn.conv.fp32_precision) == before
    assert torch.backends.cuda.matmul is matmul_flags


@needs_onednn_precision
@pytest.mark.parametrize("fast, options", [(SLOW_BOTH, {}), (FAST_BF16, {"tf32": "ignore"})])
def test_tf32_flags_change_nothing_where_there_is_no_equivalent_or_when_told(speeds, fast, options):
    mkldnn = torch.backends.mkldnn
    before = mkldnn.matmul.fp32_precision
    speeds(fast, **options)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.set_float32_matmul_precision("high")
    assert mkldnn.matmul.fp32_precision in (before, "tf32")      # torch's own mapping of "high"
    torch.set_float32_matmul_precision("highest")


@pytest.mark.parametrize("profile", ["measured", "slow", "bfloat16", "fast"])
def test_doctor_says_how_fast_each_dtype_is_and_what_requests_become(profile):
    """Measured: what this CPU's instruction set says; a host profile: that CPU's speeds,
    whatever this one is, named on doctor's host line."""
    result = python("-c", "from cudashim.cli import main; main()", "doctor", "--amp-dtype", "as-asked",
                    "--host-profile", profile)
    assert result.returncode == 0, result.stdout + result.stderr
    from cudashim.backends import cpu_speed
    fast, _ = cpu_speed.speeds(profile)
    speed = {True: "fast", False: "slow"}
    assert f"float16: {speed[fast[HALF]]}, bfloat16: {speed[fast[BF16]]}" in result.stdout
    assert "CUDA autocast: float16 runs in float16, bfloat16 in bfloat16 (--amp-dtype as-asked; " \
        "also autocast on 'cpu' itself)" in result.stdout
    assert "explicit float16 matmuls: as they are" in result.stdout
    host_line = next(line for line in result.stdout.splitlines() if line.startswith("host profile: "))
    assert host_line.startswith(f"host profile: {profile}") and "torch's kernels: " in host_line


def test_the_host_profiles_stand_for_the_cpus_they_name():
    from cudashim.backends import cpu_speed
    from cudashim.precision import AS_ASKED, BFLOAT16, FLOAT32
    assert cpu_speed.speeds("fast")[0] == FAST_BOTH
    assert cpu_speed.speeds("bfloat16")[0] == FAST_BF16
    assert cpu_speed.speeds("slow")[0] == SLOW_BOTH
    assert cpu_speed.matmul_choices("fast").for_rows(1) == AS_ASKED
    bf16, slow = cpu_speed.matmul_choices("bfloat16"), cpu_speed.matmul_choices("slow")
    assert (bf16.for_rows(2), bf16.for_rows(256)) == (AS_ASKED, BFLOAT16)
    assert (slow.for_rows(4), slow.for_rows(5)) == (AS_ASKED, FLOAT32)
    # attention in float32 on both: its decoding step too, where the products run as asked
    for choices in (bf16, slow):
        attention = choices.of_attention()
        assert attention is not choices and (attention.for_rows(1), attention.for_rows(256)) == (FLOAT32, FLOAT32)
    assert cpu_speed.matmul_choices("fast").of_attention().for_rows(1) == AS_ASKED
    # a profile stands for the matmul table; the other float16 ops run as asked under each
    assert all(cpu_speed.op_choices(profile) == {} for profile in ("fast", "bfloat16", "slow"))


@pytest.mark.parametrize("profile, runs_in", [("slow", None), ("bfloat16", BF16), ("fast", HALF)])
def test_a_host_profile_decides_what_float16_autocast_runs_in(profile, runs_in):
    import cudashim
    with cudashim.activated("cpu", host_profile=profile):
        with torch.autocast("cuda", dtype=HALF):
            out = torch.ones(2, 2, device="cuda") @ torch.ones(2, 2, device="cuda")
    assert out.dtype == (runs_in or torch.float32)


def _doctor_twice(capsys, monkeypatch, tmp_path):
    """``cudashim doctor --host-profile measured`` as two processes on this CPU would run it,
    caching in tmp_path: the output of each."""
    from cudashim.backends import cpu_speed
    from cudashim.cli import main
    monkeypatch.delenv("CUDASHIM_CACHE_DIR", raising=False)      # the suite keeps its own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    outputs = []
    for _ in range(2):
        for answer in (cpu_speed.speeds, cpu_speed.matmul_choices, cpu_speed.op_choices):
            answer.cache_clear()                        # a new process: nothing remembered
        try:
            main(["doctor", "--host-profile", "measured"])
        except SystemExit as exit:
            assert not exit.code, capsys.readouterr()
        outputs.append(capsys.readouterr().out)
    return outputs


def test_doctor_shows_the_float16_matmul_table_it_measured(capsys, monkeypatch, tmp_path, cpu_of_its_own):
    """Measured once into the user's cache, then read: the table names each shape class's
    choice and the timings it was chosen from."""
    from cudashim.backends import cpu_speed
    if cpu_speed.speeds()[0][HALF]:
        pytest.skip("float16 is fast on this CPU: nothing is measured")
    measured = []
    real_measure = cpu_speed._measure_matmuls
    monkeypatch.setattr(cpu_speed, "_measure_matmuls", lambda stopwatch: measured.append(1) or real_measure(stopwatch))
    doctor = _doctor_twice(capsys, monkeypatch, tmp_path)
    assert measured == [1]                                   # the second process read it
    cached = json.loads((tmp_path / "cudashim" / "float16-matmuls.json").read_text())
    (key, table), = cached.items()
    assert "threads, torch " in key
    lines = doctor[1]
    assert "explicit float16 matmuls (measured on this CPU" in lines and str(tmp_path) in lines
    described = {"as-asked": "in float16, as asked", "bfloat16": "in bfloat16, rounded to float16 once",
                 "float32": "in float32, rounded to float16 once"}
    assert f"memory-bound (at most {table['memory_bound_rows']} rows a matrix): " \
           f"{described[table['memory_bound']]}" in lines
    assert f"compute-bound: {described[table['compute_bound']]}" in lines
    timings = table["timings"]["compute-bound"]
    assert min(timings[c] for c in ("as-asked", "bfloat16", "float32") if c in timings) * 1.05 \
        >= timings[table["compute_bound"]]
    (_, attention), = json.loads((tmp_path / "cudashim" / "float16-attention.json").read_text()).items()
    assert "float16 attention (scaled_dot_product_attention, measured on this CPU" in lines
    assert f"decoding (at most {attention['memory_bound_rows']} queries a head): " \
           f"{described[attention['memory_bound']]}" in lines
    assert f"prefill: {described[attention['compute_bound']]}" in lines


def test_kept_float32_copies_stay_within_their_budget():
    from cudashim.patches.precision import WideningCache

    cache = WideningCache(budget_bytes=64 * 4)               # room for 64 float32 numbers
    small, large = (torch.nn.Parameter(torch.ones(n).half(), requires_grad=False) for n in (48, 32))
    assert cache.widen(small) is cache.widen(small)          # kept
    assert cache.widen(large) is not cache.widen(large)      # past the budget: widened each call
    assert cache.held == 48 * 4
    with torch.no_grad():
        small.add_(1)                                        # a new version replaces the old copy
    assert torch.equal(cache.widen(small), torch.full((48,), 2.0)) and cache.held == 48 * 4
    del small
    assert cache.held == 0 and not cache.copies


@pytest.mark.parametrize("fast, became", [(SLOW_BOTH, "float32 (autocast off)"),
                                          (FAST_BF16, "torch.bfloat16")])
def test_the_report_says_what_an_autocast_region_ran_in(speeds, fast, became):
    import cudashim.activation as activation
    speeds(fast, report=True)
    with torch.autocast("cuda", dtype=torch.float16):
        pass
    entries = activation.current_activation().report.entries
    assert entries["torch.autocast(dtype=torch.float16)"]["became"] == became
    assert entries["torch.autocast"]["became"] == "cpu"


def test_a_parameter_that_is_a_view_into_a_larger_buffer_is_never_kept():
    """ZeRO-3 gathers each parameter into a flat buffer (``param.data = buffer.narrow(...)``);
    writes into the buffer change the parameter without moving its version counter."""
    from cudashim.patches.precision import WideningCache
    cache = WideningCache(budget_bytes=2 ** 20)
    buffer = torch.zeros(64, dtype=torch.float16)
    gathered = torch.nn.Parameter(torch.empty(0, dtype=torch.float16))
    gathered.data = buffer[:48]
    own = torch.nn.Parameter(torch.ones(48, dtype=torch.float16))
    with torch.no_grad():                 # as inside an autograd.Function's forward
        assert torch.equal(cache.widen(gathered), torch.zeros(48))
        version = gathered._version
        buffer.fill_(3.0)
        assert gathered._version == version                       # nothing to see it by ...
        assert torch.equal(cache.widen(gathered), torch.full((48,), 3.0))   # ... so never kept
        assert cache.widen(own) is cache.widen(own)               # a parameter of its own is


def test_a_parameter_given_another_storage_at_the_same_address_is_widened_again():
    """ZeRO-3 frees a gathered parameter's storage and gathers into a new one, which the
    allocator may place at the old address; nothing moves the parameter's version."""
    import numpy as np
    from cudashim.patches.precision import WideningCache
    cache = WideningCache(budget_bytes=2 ** 20)
    memory = np.zeros(48, dtype=np.float16)
    first, second = torch.from_numpy(memory), torch.from_numpy(memory)   # two storages, one address
    parameter = torch.nn.Parameter(torch.empty(0, dtype=torch.float16))
    with torch.no_grad():
        parameter.data = first
        assert torch.equal(cache.widen(parameter), torch.zeros(48))
        memory[:] = 5.0                       # the next gather writes the same memory ...
        parameter.data = second               # ... and hands the parameter a new storage
        assert parameter.data_ptr() == first.data_ptr() and parameter._version == 0
        assert torch.equal(cache.widen(parameter), torch.full((48,), 5.0))


@pytest.mark.parametrize("write", ["in place", "copied in", "assigned"])
def test_a_write_through_data_is_seen_by_the_next_call(speeds, write):
    """PEFT merges an adapter into a frozen layer with ``weight.data += delta``, which moves
    no version counter; the next call computes with the merged weight, and the family is
    left with no ``data`` of its own after deactivation."""
    from cudashim.precision import FLOAT32, MatmulChoices
    torch.manual_seed(0)
    layer = torch.nn.Linear(64, 64).half().requires_grad_(False)
    x = torch.randn(8, 64).half()
    delta = torch.randn(64, 64).half()
    speeds(SLOW_BOTH, matmuls=MatmulChoices(FLOAT32, FLOAT32, 4, "test"))
    with torch.no_grad():
        before = layer(x)
        assert torch.equal(layer(x), before)                      # computed from the kept copy
        merged = layer.weight.detach() + delta
        if write == "in place":
            layer.weight.data += delta
        elif write == "copied in":
            layer.weight.data.copy_(merged)
        else:
            layer.weight.data = merged.clone()
        expected = F.linear(x.float(), merged.float(), layer.bias.float()).half()
        assert torch.equal(layer(x), expected)
    import cudashim
    cudashim.deactivate()
    assert "data" not in vars(torch.nn.Parameter)


def test_a_peft_adapter_merged_after_a_no_grad_call_is_in_the_next_output(speeds):
    """PEFT's ``merge_and_unload`` adds the adapter into the frozen base weight through
    ``weight.data += delta``, after the model has run under no_grad; the merged model gives
    the output the adapter gave."""
    pytest.importorskip("peft")
    from peft import LoraConfig, get_peft_model
    from cudashim.precision import FLOAT32, MatmulChoices

    class Projection(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 64)

        def forward(self, x):
            return self.proj(x)

    speeds(SLOW_BOTH, matmuls=MatmulChoices(FLOAT32, FLOAT32, 4, "test"))
    torch.manual_seed(0)
    model = get_peft_model(Projection(), LoraConfig(r=4, target_modules=["proj"])).cuda().half().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:                  # PEFT starts B at zero: a merge would add nothing
                parameter.normal_()
        x = torch.randn(32, 64, device="cuda", dtype=HALF)
        with_adapter = model(x)
        merged = model.merge_and_unload()(x)
    assert merged.dtype == HALF
    assert (merged.float() - with_adapter.float()).abs().max() < 0.05


def test_an_optimizer_step_drops_the_kept_copies(speeds):
    """Mixed-precision optimizers copy their float32 master weights back into the float16
    parameters through ``.data``, which no version counter sees."""
    speeds(SLOW_BOTH)
    layer = torch.nn.Linear(8, 8, bias=False).cuda().half()
    master = torch.nn.Parameter(layer.weight.detach().float())
    optimizer = torch.optim.SGD([master], lr=1.0)
    x = torch.ones(1, 8, device="cuda", dtype=HALF)
    with torch.no_grad():
        before = layer(x)
        assert torch.equal(layer(x), before)                  # kept and used again
    master.grad = torch.ones_like(master)
    optimizer.step()
    layer.weight.data.copy_(master)                           # the master weights written back
    with torch.no_grad():
        assert torch.allclose(layer(x).float(), before.float() - 8, atol=0.02)   # each weight fell by 1
    import cudashim
    cudashim.deactivate()
    from torch.optim.optimizer import _global_optimizer_post_hooks
    assert not _global_optimizer_post_hooks                   # the hook goes too


def test_trained_parameters_are_kept_only_while_no_gradient_is_recorded_and_until_a_step():
    """A training process that evaluates or generates under no_grad (HF Trainer's
    ``fp16_full_eval``) keeps its copies until its optimizer steps again; its training
    forward passes widen at every call."""
    from cudashim.patches.precision import WideningCache
    cache = WideningCache(budget_bytes=2 ** 20)
    trained = torch.nn.Parameter(torch.ones(8, dtype=torch.float16))
    frozen = torch.nn.Parameter(torch.ones(8, dtype=torch.float16), requires_grad=False)
    assert cache.widen(trained) is not cache.widen(trained)          # training: each call
    with torch.no_grad():
        kept = cache.widen(trained)
        assert cache.widen(trained) is kept and cache.widen(frozen) is cache.widen(frozen)
        cache.optimizer_stepped()
        assert cache.widen(trained) is not kept                      # a step drops it
        assert cache.widen(trained) is cache.widen(trained)


def test_measuring_the_float16_matmuls_leaves_the_programs_random_numbers_alone(monkeypatch, tmp_path,
                                                                                cpu_of_its_own):
    """The measurement runs at activation, inside the user's program: its generator is its own.
    It runs where float16 is slow: this CPU's speeds are those of one that emulates it."""
    from cudashim.backends import cpu_speed
    monkeypatch.delenv("CUDASHIM_CACHE_DIR", raising=False)      # the suite keeps its own
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setattr(cpu_speed, "speeds", lambda profile: ({torch.float16: False, torch.bfloat16: False},
                                                              "a CPU that emulates float16"))
    cpu_speed.matmul_choices.cache_clear()
    torch.manual_seed(1234)
    before = torch.random.get_rng_state()
    choices = cpu_speed.matmul_choices()
    assert torch.equal(torch.random.get_rng_state(), before)
    assert (tmp_path / "cudashim" / "float16-matmuls.json").exists() and choices.memory_bound_rows >= 2
