"""Triton kernels written for CUDA, on targets Triton has no backend for.

Triton comes with the CUDA builds of torch, which the torch-range environments install (it is
what a machine without a GPU has after ``pip install torch``); the main environment's CPU torch
brings none, and there these tests skip. The programs run on the CPU backend and on the test
accelerator, whose memory the host cannot touch: the interpreter's copies of a kernel's tensors
to the host and back are what that proves.
"""

import json

import pytest

from conftest import python
from targets import SHIMDEV, targets

triton = pytest.importorskip("triton", reason="triton comes with torch's CUDA builds (tox -e torch2.14)")
tl = pytest.importorskip("triton.language")

pytestmark = pytest.mark.torch_range


def _interpreter_refusal():
    """Why this triton's interpreter cannot run kernels here ('' where it can), asked in a
    fresh interpreter as cudashim asks it."""
    result = python("-c", "from cudashim.patches.triton import gaps; print(gaps.store_works())")
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip()


def _run(program, out, *args, target=None, report=None):
    options = target.options if target else ()
    reporting = ("--report-json", str(report)) if report else ()
    return python("-m", "cudashim", *options, *reporting, program, str(out), *args, timeout=600)


def _interpreted(report) -> dict:
    return json.loads(report.read_text())["interpreted"]


def test_the_tutorials_kernels_run_through_the_interpreter_on_every_target(tmp_path):
    """Triton's tutorial kernels, unmodified CUDA code: each equals torch's op within its dtype's
    tolerance, on the CPU backend and on the test accelerator; the report lists every kernel."""
    import torch

    refused = _interpreter_refusal()
    for target in [None, *targets(where=lambda target: target is SHIMDEV)]:
        name = target.name if target else "cpu"
        out, report = tmp_path / f"{name}.json", tmp_path / f"{name}.report.json"
        run = _run("tests/programs/triton_tutorials.py", out, target=target, report=report)
        if refused:
            # This triton's interpreter cannot store (Triton 3.0 with numpy 2): one refusal
            # naming the kernel and the reason, never numbers that were never written.
            assert run.returncode != 0
            assert "the Triton kernel __main__.axpy_kernel is not supported by cudashim" in run.stderr
            assert "stores nothing with numpy" in run.stderr
            continue
        assert run.returncode == 0, f"{name}: {run.stderr[-4000:]}"
        seen = json.loads(out.read_text())
        errors = seen["errors"]
        exact = {"elementwise", "triton_op"} & errors.keys()
        assert all(errors[kernel] <= 1e-6 for kernel in exact), (name, errors)
        assert errors["softmax"] <= 1e-6 and errors["libdevice"] <= 1e-6, (name, errors)
        assert errors["layer_norm_forward"] <= 1e-5 and errors["layer_norm_backward"] <= 1e-5, (name, errors)
        # Results rounded to 16 bits once, from float32 sums whose order differs from torch's:
        # one rounding step apart at most, at the largest result's magnitude.
        scales = seen["scales"]
        for kernel, dtype in (("matmul", torch.float16), ("matmul_squared_relu", torch.float16),
                              ("chunked_scan_bfloat16", torch.bfloat16)):
            assert errors[kernel] <= 2 * torch.finfo(dtype).eps * scales[kernel], (name, kernel, errors, scales)
        assert errors["chunked_scan"] <= 1e-4, (name, errors)     # running sums of about 40 values
        expected_device = target.device(0) if target else "cpu"
        assert set(seen["devices"].values()) == {expected_device}, seen["devices"]
        assert seen["cuda_target"] == "cuda"
        # Autotuning ran the first of the kernel's configs, not a timing of each.
        assert seen["tuned"] == {"TILE_M": 64, "TILE_N": 128, "TILE_K": 32, "SUPER": 4}
        interpreted = _interpreted(report)
        kernels = {"axpy_kernel", "row_softmax_kernel", "norm_forward_kernel", "norm_backward_kernel",
                   "column_sum_kernel", "matmul_kernel", "chunked_cumsum_kernel", "libdevice_kernel"}
        assert {kernel.rpartition(".")[2] for kernel in interpreted} >= kernels, interpreted
        assert interpreted["__main__.column_sum_kernel"]["launches"] == 2
        assert interpreted["__main__.matmul_kernel"]["on"] == (target.name if target else "cpu")


def test_liger_kernels_train_a_transformer_as_torch_ops_do(tmp_path):
    """Liger's RMSNorm, SwiGLU, rotary embedding and fused linear cross-entropy in a small
    decoder's training steps, in float32 and under bfloat16 autocast: the losses and weights
    follow the same model on torch's ops, on the CPU backend and on the test accelerator."""
    pytest.importorskip("liger_kernel", reason="liger-kernel is installed with the torch-range environments")
    if _interpreter_refusal():
        pytest.skip("this triton's interpreter cannot store here (the tutorials test checks the refusal)")
    for target in [None, *targets(where=lambda target: target is SHIMDEV)]:
        name = target.name if target else "cpu"
        for precision, args, tolerance, drift in (("float32", (), 1e-5, 1e-4),
                                                  ("bfloat16", ("--bf16",), 1e-3, 0.06)):
            out, report = tmp_path / f"{name}-{precision}.json", tmp_path / f"{name}-{precision}.report.json"
            run = _run("tests/programs/liger_transformer.py", out, *args, target=target, report=report)
            assert run.returncode == 0, f"{name}, {precision}: {run.stderr[-4000:]}"
            seen = json.loads(out.read_text())
            assert seen["liger"] == pytest.approx(seen["reference"], rel=tolerance), (name, precision)
            # AdamW moves each weight by about the learning rate per step: a gradient whose sign
            # bfloat16 rounds differently moves it the other way, never further.
            assert seen["weight_difference"] <= drift, (name, precision, seen)
            assert seen["device"] == (target.device(0) if target else "cpu")
            interpreted = {kernel.rpartition(".")[2] for kernel in _interpreted(report)}
            assert {"_rms_norm_forward_kernel", "_rms_norm_backward_kernel", "_swiglu_forward_kernel",
                    "_triton_rope"} <= interpreted, interpreted


def test_a_kernel_launched_inside_a_cuda_graph_capture_runs_again_at_each_replay(tmp_path):
    """A Triton kernel storing a decoding step's keys into a cache, captured in a CUDA graph with
    an op that reads the cache after it: the capture leaves the cache as it found it, and each
    replay stores the new keys at the new slots (a slot of -1 skipped) before that op reads them,
    on the CPU backend and on the test accelerator, whose memory the interpreter copies to the
    host and back. Before it, an eager store into one layer's view of a large cache writes its
    rows alone; on the CPU backend without a copy of the cache, and no capture copies the layer."""
    if _interpreter_refusal():
        pytest.skip("this triton's interpreter cannot store here (the tutorials test checks the refusal)")
    for target in [None, *targets(where=lambda target: target is SHIMDEV)]:
        name = target.name if target else "cpu"
        out = tmp_path / f"{name}.json"
        run = _run("tests/programs/triton_graphs.py", out, target=target)
        assert run.returncode == 0, f"{name}: {run.stderr[-4000:]}"
        seen = json.loads(out.read_text())
        eager_growth, capture_growth = seen.pop("eager_peak_growth"), seen.pop("capture_peak_growth")
        assert seen == {"untouched_by_capture": True, "replays": [True, True, True],
                        "device": target.device(0) if target else "cpu", "large_stored": True}, name
        # The capture saves no copy of what the kernel may write (a copy of the layer: 1.0).
        assert capture_growth < 0.25, (name, capture_growth)
        if target is None:
            # Device memory is host memory: the interpreter stores into the cache itself (a copy
            # of the whole storage to the host and back: 1.0).
            assert eager_growth < 0.25, eager_growth


# --- in this process ---------------------------------------------------------------------
@triton.jit
def _inline_ptx_kernel(x_ptr, out_ptr, BLOCK: tl.constexpr):
    offsets = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets)
    y = tl.inline_asm_elementwise("mov.b32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                               is_pure=True, pack=1)
    tl.store(out_ptr + offsets, y)


@triton.jit
def _double_kernel(x_ptr, out_ptr, size, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < size
    tl.store(out_ptr + offsets, 2 * tl.load(x_ptr + offsets, mask=inside), mask=inside)


def _keep_blocks_of_32_or_less(configs, named_args, **kwargs):
    return [config for config in configs if config.kwargs["BLOCK"] <= 32]



def test_a_kernel_the_interpreter_cannot_run_is_refused_by_name_and_the_library_falls_back(shim):
    import torch
    from cudashim.errors import UnsupportedCudaAPI

    if _interpreter_refusal():
        pytest.skip("this triton's interpreter cannot store here (the tutorials test checks the refusal)")
    x = torch.arange(8.0, device="cuda")
    out = torch.empty_like(x)
    with pytest.raises(UnsupportedCudaAPI) as refused:
        _inline_ptx_kernel[(1, )](x, out, BLOCK=8)
    assert isinstance(refused.value, RuntimeError)
    assert f"the Triton kernel {__name__}._inline_ptx_kernel" in str(refused.value)
    assert "Triton's interpreter" in str(refused.value) and "inline_asm" in str(refused.value)

    def library_op(x):            # as libraries guard their Triton paths
        try:
            result = torch.empty_like(x)
            _inline_ptx_kernel[(1, )](x, result, BLOCK=8)
            return result
        except RuntimeError:
            return x.clone()

    assert torch.equal(library_op(x), x)


def test_autotuning_runs_the_first_config_its_pruning_keeps(shim):
    import torch

    if _interpreter_refusal():
        pytest.skip("this triton's interpreter cannot store here (the tutorials test checks the refusal)")
    # Made under cudashim: Triton 3.3 asks the active driver for its benchmarker as it decorates.
    _tuned_double_kernel = triton.autotune(
        configs=[triton.Config({"BLOCK": 64}), triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 16})],
        key=["size"], prune_configs_by={"early_config_prune": _keep_blocks_of_32_or_less})(_double_kernel)
    x = torch.randn(100, device="cuda")
    out = torch.empty_like(x)
    _tuned_double_kernel[lambda meta: (triton.cdiv(100, meta["BLOCK"]), )](x, out, 100)
    assert torch.equal(out, 2 * x)
    assert _tuned_double_kernel.best_config.kwargs == {"BLOCK": 32}
    assert len(_tuned_double_kernel.configs) == 3            # the kernel's own list is left whole


def test_deactivation_gives_triton_back_its_launcher_and_driver():
    import importlib

    import torch  # noqa: F401
    import cudashim
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    config = importlib.import_module("triton.runtime.driver").driver
    before = (JITFunction.run, JITFunction.__call__, Autotuner.run, dict(vars(config)))
    cudashim.activate("cpu")
    assert JITFunction.run is not before[0]
    assert type(config.active).__name__ == "InterpretedDriver"
    assert config.active.utils.get_device_properties(0)["warpSize"] == 32
    cudashim.deactivate()
    assert (JITFunction.run, JITFunction.__call__, Autotuner.run, dict(vars(config))) == before


def test_a_target_with_a_triton_backend_of_its_own_launches_there(monkeypatch):
    """Where Triton has a backend for the target (Intel's for XPU, triton-ascend for NPU),
    its driver is active and Triton compiles for it: cudashim patches nothing of Triton's."""
    import types

    import torch  # noqa: F401
    import cudashim
    import triton.backends
    from cudashim.patches import triton as triton_group
    from triton.runtime.jit import JITFunction

    vendor = types.SimpleNamespace(driver=types.SimpleNamespace(is_active=staticmethod(lambda: True)))
    monkeypatch.setitem(triton.backends.backends, "vendor", vendor)
    assert triton_group.own_backend(triton) == "vendor"
    launcher = JITFunction.run
    cudashim.activate("cpu")
    try:
        assert JITFunction.run is launcher
    finally:
        cudashim.deactivate()


def test_the_report_lists_interpreted_kernels_with_their_launches_and_time():
    from cudashim.report import Report

    report = Report("cpu")
    report.interpreted("lib.kernel", "cpu", 0.25)
    report.interpreted("lib.kernel", "cpu", 0.5)
    assert report.as_dict()["interpreted"] == {"lib.kernel": {"launches": 2, "seconds": 0.75, "on": "cpu"}}
    assert "lib.kernel: 2 launches on cpu, 0.750 s" in report.render()


def test_the_doctor_says_where_a_triton_kernel_goes():
    result = python("-c", "from cudashim.cli import main; main()", "doctor")
    assert result.returncode == 0, result.stderr[-3000:]
    line = next(line for line in result.stdout.splitlines() if line.startswith("Triton kernels:"))
    version = f"triton {triton.__version__}"
    refused = _interpreter_refusal()
    expected = f"{version}: refused: {refused}" if refused else \
        f"{version}: no Triton backend for the cpu device: each launch runs through Triton's interpreter"
    assert line.startswith(f"Triton kernels: {expected}"), line


def test_torch_compile_runs_a_kernel_launch_between_its_graphs(shim):
    """Dynamo knows Triton kernels only where a GPU is: here a launch in compiled code runs as
    it is, interpreted, between the graphs around it."""
    import torch

    if _interpreter_refusal():
        pytest.skip("this triton's interpreter cannot store here (the tutorials test checks the refusal)")

    def doubled_plus_one(x):
        out = torch.empty_like(x)
        _double_kernel[(triton.cdiv(x.numel(), 32), )](x, out, x.numel(), BLOCK=32)
        return out + 1

    x = torch.randn(100, device="cuda")
    assert torch.equal(torch.compile(doubled_plus_one, backend="eager")(x), 2 * x + 1)
