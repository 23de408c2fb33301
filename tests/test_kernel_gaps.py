"""Dtypes CUDA kernels take and the CPU's refuse: the table is torch's own, each fill
computes what a wider kernel computes, and nothing else is touched."""

import functools
import sys
import warnings

import pytest
import torch

from conftest import python

from cudashim.tables.dtype_gaps import GAPS
from cudashim.kernels.gap_fill import compute_dtype

pytestmark = pytest.mark.host          # the widened ops run on torch's kernels for this CPU

# The reference computes in the widest dtype of the gap's kind.
WIDEST = {torch.bool: torch.uint8, torch.float16: torch.float64, torch.bfloat16: torch.float64,
          **{d: torch.float64 for d in (
              torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)}}
TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 5e-2}
# Ops that draw random numbers: their reference draws the same numbers, in the dtype the fill
# computes in (a float64 draw is another stream).
RANDOM = {"nn.functional.rrelu"}


@functools.lru_cache(maxsize=None)
def _op_db():
    pytest.importorskip("expecttest")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from torch.testing._internal.common_methods_invocations import op_db
    return op_db


@pytest.mark.torch_range
def test_the_table_is_what_this_torch_says():
    """On the main suite's torch, the main table; on another release, its entry of the table of
    gaps beyond it (``tox -e torch2.4`` and the others run this)."""
    pytest.importorskip("expecttest")
    result = python("scripts/kernel_gaps.py", "--check", timeout=600)
    assert result.returncode == 0, result.stderr[-2000:]
    assert GAPS["abs"][0] == ("bool",)                 # the gap a transformer's eval step hits


def test_a_release_between_two_the_tables_were_made_on_has_the_gaps_of_both():
    from cudashim.patches.kernel_gaps import gaps_of
    from cudashim.tables.dtype_gaps import GENERATED_ON
    from cudashim.tables.dtype_gaps_by_release import BEYOND
    oldest = min(BEYOND, key=lambda name: tuple(map(int, name.split("."))))
    assert gaps_of(GENERATED_ON) == {name: (tuple(sorted(d)), tuple(sorted(m))) for name, (d, m) in GAPS.items()}
    assert "float16" in gaps_of("2.4.1")["nn.functional.grid_sample"][0]
    assert "float16" in gaps_of("2.3.0")["nn.functional.grid_sample"][0]       # past the oldest: its gaps
    between = gaps_of("2.5.1")
    for name, (dtypes, _) in (*BEYOND[oldest].items(), *BEYOND["2.7.1"].items()):
        assert set(dtypes) <= set(between[name][0]), name
    assert "bfloat16" in gaps_of("2.14.0")["fft.rfft"][0] and "bfloat16" in gaps_of("2.16.0")["fft.rfft"][0]
    assert gaps_of("2.14.1")["abs"] == (("bool",), ("abs", "abs_"))
    assert "bfloat16" not in gaps_of("2.4.1")["fft.rfft"][0]


@pytest.mark.torch_range
def test_a_cuda_program_calling_what_this_releases_cpu_lacks_runs(shim):
    """Calls a CUDA program makes in dtypes CUDA's kernels take and some release's CPU kernels
    refuse (torch 2.4: float16 grid_sample, reflection padding, isin, max_unpool and
    adaptive_max_pool3d, bfloat16 mse_loss; every release: float16 FFTs, antialiased resizing in
    float16 and bfloat16, which torchvision's Resize does by default): on every release they run,
    each result in CUDA's dtype and what the float32 kernel computes, rounded to it."""
    torch.manual_seed(0)
    images = torch.randn(2, 3, 6, 8, device="cuda")
    grid = torch.rand(2, 4, 5, 2, device="cuda") * 2 - 1
    pooled, where = torch.nn.functional.max_pool2d(images, 2, return_indices=True)
    volume = torch.randn(1, 2, 4, 6, 6, device="cuda")
    signal, target = torch.randn(4, 64, device="cuda"), torch.randn(4, 64, device="cuda")
    F = torch.nn.functional
    calls = {
        "grid_sample": (torch.float16, lambda t: F.grid_sample(t(images), t(grid), align_corners=False)),
        "pad, reflect": (torch.float16, lambda t: F.pad(t(images), (2, 1, 1, 2), mode="reflect")),
        "isin": (torch.float16, lambda t: torch.isin(t(images), t(images[0, 0, 0]))),
        "max_unpool2d": (torch.float16, lambda t: F.max_unpool2d(t(pooled), where, 2)),
        "adaptive_max_pool3d": (torch.float16, lambda t: F.adaptive_max_pool3d(t(volume), 2)),
        "mse_loss": (torch.bfloat16, lambda t: F.mse_loss(t(signal), t(target))),
        "trace": (torch.float16, lambda t: torch.trace(t(signal[:, :4]))),
        "rfft": (torch.float16, lambda t: torch.fft.rfft(t(signal))),
        "interpolate, antialiased bilinear": (
            torch.float16, lambda t: F.interpolate(t(images), size=(3, 5), mode="bilinear", antialias=True)),
        "interpolate, antialiased bicubic": (
            torch.bfloat16, lambda t: F.interpolate(t(images), size=(12, 4), mode="bicubic", antialias=True)),
    }
    for name, (dtype, call) in calls.items():
        result = call(lambda x: x.to(dtype))
        expected = call(lambda x: x.to(dtype).float())
        assert result.is_cuda, name
        if expected.is_floating_point():
            assert result.dtype == dtype, name
            expected = expected.to(dtype)
        elif expected.is_complex():
            assert result.dtype.is_complex, name
        torch.testing.assert_close(result.to(expected.dtype), expected, rtol=2e-2, atol=2e-2, msg=name)


def _resolve(name):
    target = torch
    for part in name.split("."):
        target = getattr(target, part)
    return target


def _cases():
    for op in _op_db():
        if op.name not in GAPS:
            continue
        for dtype_name in GAPS[op.name][0]:
            dtype = getattr(torch, dtype_name)
            if dtype not in op.supported_dtypes("cuda"):
                continue                                   # another variant's gap (div's modes)
            for sample in list(op.sample_inputs("cpu", dtype, requires_grad=False))[:3]:
                yield op, dtype, sample


def _widened(value, gap, wide):
    return value.to(wide) if isinstance(value, torch.Tensor) and value.dtype == gap else value


def test_every_fill_computes_what_a_wider_kernel_computes():
    import cudashim as shim
    cases = list(_cases())                 # before activation: OpInfo parses "cuda" itself
    shim.activate("cpu")
    checked = set()
    for op, gap, sample in cases:
        function = _resolve(op.name)                       # the filled one: op.op is torch's own
        assert getattr(function, "cudashim_gap_dtypes", None), op.name
        wide = compute_dtype(gap) if op.name in RANDOM else WIDEST[gap]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.manual_seed(0)
            result = function(sample.input, *sample.args, **sample.kwargs)
            torch.manual_seed(0)
            reference = shim.get_original(*_owner_and_name(op.name))(
                _widened(sample.input, gap, wide), *[_widened(a, gap, wide) for a in sample.args],
                **{k: _widened(v, gap, wide) for k, v in sample.kwargs.items()})
        results = result if isinstance(result, (tuple, list)) else (result,)
        references = reference if isinstance(reference, (tuple, list)) else (reference,)
        for got, want in zip(results, references):
            if not isinstance(got, torch.Tensor):
                continue
            # CUDA's dtype: the gap's own where the op keeps its input's dtype, else of the
            # kind the op promotes to (trace(bool) is an integer, angle(complex32) a float).
            if want.dtype == wide:
                assert got.dtype == gap, (op.name, gap, got.dtype)
            else:
                assert (got.dtype.is_complex, got.dtype.is_floating_point) == \
                    (want.dtype.is_complex, want.dtype.is_floating_point), (op.name, gap, got.dtype)
            # Against the wide reference rounded to the result's dtype, as CUDA's result is,
            # where that is finite (past half's range both overflow, to inf or nan).
            rounded = want.to(got.dtype).to(want.dtype)
            finite = torch.isfinite(rounded) if rounded.is_floating_point() or rounded.is_complex() \
                else torch.ones_like(rounded, dtype=torch.bool)
            tolerance = TOLERANCE.get(gap, 0)
            torch.testing.assert_close(got.to(want.dtype)[finite], rounded[finite], rtol=tolerance,
                                       atol=tolerance, equal_nan=True, msg=f"{op.name} in {gap}")
        checked.add((op.name, gap))
    assert len(checked) >= len(GAPS)


def _owner_and_name(name):
    module_name, _, attribute = f"torch.{name}".rpartition(".")
    return sys.modules[module_name], attribute


def test_methods_and_in_place_forms_are_filled_too(shim):
    flags = torch.tensor([True, False, True])
    assert torch.equal(flags.abs(), flags) and flags.abs().dtype == torch.bool
    copy = flags.clone()
    assert copy.abs_() is copy and torch.equal(copy, flags)
    counts = torch.tensor([1, 2, 2, 3]).histc(bins=3, min=1, max=3)
    assert counts.tolist() == [1, 2, 1] and counts.dtype == torch.int64


def test_a_filled_call_writes_its_out_tensor(shim):
    """torch.abs(flags, out=buffer) and histc(..., out=counts) find their result where they
    asked for it, as CUDA's out= variants write it; an out= of another shape is resized, with
    torch's warning where it held elements."""
    flags = torch.tensor([True, False, True])
    buffer = torch.zeros(3, dtype=torch.bool)
    assert torch.abs(flags, out=buffer) is buffer and buffer.tolist() == [True, False, True]
    counts = torch.zeros(3, dtype=torch.int64)
    values = torch.tensor([1, 2, 2, 3])
    assert torch.histc(values, bins=3, min=1, max=3, out=counts) is counts and counts.tolist() == [1, 2, 1]
    unsized = torch.empty(0, dtype=torch.bool)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                     # an empty out= is resized silently
        assert torch.abs(flags, out=unsized) is unsized and unsized.tolist() == [True, False, True]
    wrong = torch.zeros(5, dtype=torch.int64)
    with pytest.warns(UserWarning, match="An output with one or more elements was resized"):
        torch.histc(values, bins=3, min=1, max=3, out=wrong)
    assert wrong.tolist() == [1, 2, 1]


def test_only_functions_with_a_gap_are_wrapped(shim):
    assert torch.add is shim.get_original(torch, "add")
    assert torch.Tensor.add is shim.get_original(torch.Tensor, "add")
    # Hot ops whose only gap is complex32 (experimental in torch) are left unwrapped.
    assert torch.sum is shim.get_original(torch, "sum")
    assert not hasattr(torch.Tensor.pow, "cudashim_gap_dtypes")     # (float16 powers may be timed)
    assert torch.abs is not shim.get_original(torch, "abs")
    x = torch.randn(5)
    assert torch.equal(torch.abs(x), shim.get_original(torch, "abs")(x))


def test_an_eval_step_taking_abs_of_a_bool_mask_runs():
    program = ("import torch\n"
               "pred, labels = torch.tensor([1, 0, 2]), torch.tensor([1, 1, 2])\n"
               "print('agreement', torch.abs(pred == labels).sum().item())\n")
    result = python("-m", "cudashim", "-c", program)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "agreement 2" in result.stdout
    without = python("-m", "cudashim", "--disable", "kernel_gaps", "-c", program)
    assert without.returncode != 0 and "not implemented for 'Bool'" in without.stderr


def test_doctor_lists_the_gaps_and_how_each_is_computed():
    result = python("-c", "from cudashim.cli import main; main(['doctor', '--kernels'])")
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"{len(GAPS)} functions" in result.stdout
    line = next(line for line in result.stdout.splitlines() if line.strip().startswith("torch.abs "))
    assert "bool in uint8" in line and "Tensor.abs_" in line


# --- CUDA-only ops torch calls on accelerators ---------------------------------------------
def _fused(forward, backward_of):
    """An autograd Function from a portable forward kernel and its backward kernel, as the
    dispatcher pairs them through torch's derivative formulas."""
    class Fused(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *args):
            outputs = forward(*args)
            ctx.save_for_backward(*args, *outputs)
            return outputs

        @staticmethod
        def backward(ctx, *grads):
            return backward_of(ctx.saved_tensors, grads)
    return Fused.apply


def _lstm_backward(saved, grads):
    from cudashim.kernels.cuda_only_ops import fused_lstm_cell_backward_impl
    _, _, cx, _, _, _, cy, workspace = saved
    grad_gates, grad_cx, grad_bias = fused_lstm_cell_backward_impl(grads[0], grads[1], cx, cy, workspace, True)
    return grad_gates, grad_gates, grad_cx, grad_bias, grad_bias


def _gru_backward(saved, grads):
    from cudashim.kernels.cuda_only_ops import fused_gru_cell_backward
    workspace = saved[-1]
    return fused_gru_cell_backward(grads[0], workspace, True)


@pytest.mark.parametrize("cell", ["lstm", "gru"])
def test_the_portable_fused_cells_compute_what_torch_computes_unfused(cell):
    """The fused LSTM and GRU cells (CUDA-only ops torch calls on every accelerator) and
    their backward kernels give the values and gradients of torch's own unfused cell."""
    from cudashim.kernels import cuda_only_ops

    torch.manual_seed(0)
    gates = 4 if cell == "lstm" else 3
    batch, size, hidden = 3, 5, 4
    leaves = [torch.randn(*shape, dtype=torch.float64, requires_grad=True) for shape in (
        (batch, size), (batch, hidden), (batch, hidden), (gates * hidden, size),
        (gates * hidden, hidden), (gates * hidden,), (gates * hidden,))]
    x, hx, cx, w_ih, w_hh, b_ih, b_hh = leaves
    if cell == "lstm":
        expected = torch.lstm_cell(x, (hx, cx), w_ih, w_hh, b_ih, b_hh)
        fused = _fused(cuda_only_ops.fused_lstm_cell, _lstm_backward)
        got = fused(x @ w_ih.T, hx @ w_hh.T, cx, b_ih, b_hh)[:2]
    else:
        expected = (torch.gru_cell(x, hx, w_ih, w_hh, b_ih, b_hh),)
        fused = _fused(cuda_only_ops.fused_gru_cell, _gru_backward)
        got = fused(x @ w_ih.T, hx @ w_hh.T, hx, b_ih, b_hh)[:1]
    for mine, theirs in zip(got, expected):
        torch.testing.assert_close(mine, theirs)
    weights = [torch.randn_like(t) for t in expected]
    used = [leaf for leaf in leaves if cell == "lstm" or leaf is not cx]
    expected_grads = torch.autograd.grad(expected, used, weights)
    got_grads = torch.autograd.grad(got, used, weights)
    for mine, theirs in zip(got_grads, expected_grads):
        torch.testing.assert_close(mine, theirs)


def _attention_inputs(heads_kv=4, length_k=6, dtype=torch.float64):
    generator = torch.Generator().manual_seed(0)
    shapes = ((2, 4, 5, 8), (2, heads_kv, length_k, 8), (2, heads_kv, length_k, 8))
    return [torch.randn(*shape, generator=generator, dtype=dtype) for shape in shapes]


@pytest.mark.parametrize("is_causal, heads_kv, length_k", [(False, 4, 6), (True, 4, 5), (True, 2, 5)])
def test_the_portable_flash_attention_computes_what_attentions_definition_does(is_causal, heads_kv, length_k):
    """CUDA's flash attention op (which context parallelism's ring attention calls on each
    block) and its backward, against torch's math path and its autograd: causal, grouped-query
    (fewer key and value heads), a longer key; the log-sum-exp is the scores' row by row."""
    from cudashim.kernels import fused_attention

    query, key, value = leaves = [t.requires_grad_() for t in _attention_inputs(heads_kv, length_k)]
    expected = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, is_causal=is_causal, enable_gqa=heads_kv != 4)
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, leaves, grad_out)

    plain = [t.detach() for t in leaves]
    out, logsumexp, cum_q, cum_k, max_q, max_k, seed, offset, _ = fused_attention.flash_attention(
        *plain, 0.0, is_causal)
    torch.testing.assert_close(out, expected)
    scores = query @ key.repeat_interleave(4 // heads_kv, dim=1).transpose(-2, -1) / 8 ** 0.5
    if is_causal:
        scores = scores.masked_fill(~torch.ones(5, length_k, dtype=torch.bool).tril(), float("-inf"))
    torch.testing.assert_close(logsumexp, scores.logsumexp(-1).detach())
    assert (cum_q, cum_k, max_q, max_k) == (None, None, 5, length_k)
    grads = fused_attention.flash_attention_backward(grad_out, *plain, out, logsumexp, cum_q, cum_k, max_q,
                                                     max_k, 0.0, is_causal, seed, offset)
    for mine, theirs in zip(grads, expected_grads):
        torch.testing.assert_close(mine, theirs)


def test_the_portable_efficient_attention_takes_a_bias_and_returns_its_gradient():
    from cudashim.kernels import fused_attention

    *qkv, bias = leaves = [t.requires_grad_() for t in (*_attention_inputs(), torch.randn(1, 4, 5, 6).double())]
    expected = torch.nn.functional.scaled_dot_product_attention(*qkv, attn_mask=bias)
    grad_out = torch.randn_like(expected)
    expected_grads = torch.autograd.grad(expected, leaves, grad_out)
    plain = [t.detach() for t in leaves]
    out, logsumexp, seed, offset = fused_attention.efficient_attention(*plain, True)
    torch.testing.assert_close(out, expected)
    assert fused_attention.efficient_attention(*plain, False)[1].numel() == 0    # not asked for
    grads = fused_attention.efficient_attention_backward(grad_out, *plain, out, logsumexp, seed, offset, 0.0,
                                                         [True] * 4)
    for mine, theirs in zip(grads, expected_grads):
        torch.testing.assert_close(mine.sum_to_size(theirs.shape), theirs)   # autograd sums the bias's


def test_the_portable_attention_drops_the_same_weights_forward_and_backward():
    """Dropout's mask comes from the seed the forward drew and returned: the backward's
    gradients are those of the forward it was given, computed by autograd."""
    from cudashim.kernels import fused_attention

    plain = _attention_inputs()
    out, logsumexp, cum_q, cum_k, max_q, max_k, seed, offset, _ = fused_attention.flash_attention(*plain, 0.5)
    kept = fused_attention._kept(seed, (2, 4, 5, 6), 0.5, "cpu", torch.float64)
    assert 0.2 < float((kept != 0).double().mean()) < 0.8
    query, key, value = leaves = [t.clone().requires_grad_() for t in plain]
    expected = (((query @ key.transpose(-2, -1)) / 8 ** 0.5).softmax(-1) * kept) @ value
    torch.testing.assert_close(out, expected)
    grad_out = torch.randn_like(out)
    grads = fused_attention.flash_attention_backward(grad_out, *plain, out, logsumexp, cum_q, cum_k, max_q,
                                                     max_k, 0.5, False, seed, offset)
    for mine, theirs in zip(grads, torch.autograd.grad(expected, leaves, grad_out)):
        torch.testing.assert_close(mine, theirs)
    again = fused_attention.flash_attention(*plain, 0.5)
    assert not torch.equal(again[0], out)                    # another call, another seed


def test_cudas_attention_ops_run_on_the_target_while_active_and_are_gone_after(shim):
    """Called by name on CUDA tensors, with autograd through the registered backward; the
    host's kernel for them exists only while cudashim is active."""
    inputs = [t.float().cuda() for t in _attention_inputs(length_k=5)]
    leaves = [t.clone().requires_grad_() for t in inputs]
    out = torch.ops.aten._scaled_dot_product_flash_attention(*leaves, is_causal=True)[0]
    references = [t.clone().requires_grad_() for t in inputs]
    expected = torch.nn.functional.scaled_dot_product_attention(*references, is_causal=True)
    torch.testing.assert_close(out, expected)
    for mine, theirs in zip(torch.autograd.grad(out.sum(), leaves), torch.autograd.grad(expected.sum(), references)):
        torch.testing.assert_close(mine, theirs)
    flash = "aten::_scaled_dot_product_flash_attention"
    assert torch._C._dispatch_has_kernel_for_dispatch_key(flash, "CPU")
    shim.deactivate()
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(flash, "CPU")
    shim.activate("cpu")


def test_portable_kernels_are_registered_only_where_the_target_has_none():
    from cudashim.kernels.cuda_only_ops import OPS
    from cudashim.patches import kernel_gaps

    assert kernel_gaps.dispatch_key("cuda") is None and kernel_gaps.missing_ops("cuda") == []
    assert kernel_gaps.dispatch_key("cpu") == "CPU" and kernel_gaps.dispatch_key("xpu") == "XPU"
    # This CPU build has a kernel for none of them, on the host or on any accelerator's key.
    assert kernel_gaps.missing_ops("cpu") == kernel_gaps.missing_ops("xpu") == list(OPS)


def test_bitsandbytes_says_at_import_what_has_no_kernel_on_the_target():
    """Before a model is loaded: bitsandbytes' CPU backend covers everything here, while a
    PrivateUse1 accelerator gets only its kernels in torch operations, no 8-bit optimizer."""
    pytest.importorskip("bitsandbytes")
    import cudashim
    from cudashim.patches import kernel_gaps
    cudashim.activate("cpu")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import bitsandbytes
    assert not [w for w in caught if "no kernel" in str(w.message)]
    assert kernel_gaps.bitsandbytes_gaps("cpu") == {} and kernel_gaps.bitsandbytes_gaps("cuda") == {}
    accelerator = torch._C._get_privateuse1_backend_name()
    gaps = kernel_gaps.bitsandbytes_gaps(accelerator)
    assert [feature.split(" (")[0] for feature in gaps] == ["8-bit optimizers"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kernel_gaps._say_bitsandbytes_gaps(accelerator, bitsandbytes)
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "optimizer_update_8bit_blockwise" in said[0] and accelerator in said[0]


def test_where_the_fast_path_runs_a_filled_function_is_its_compiled_gate_and_agrees_with_python():
    """The gate sends calls in the gap to the fill's widening and every other call straight to
    the op; it carries the fill as its twin, and both give the same results on each call shape,
    before the first call in the gap (told by the op's refusal) and after it (by dtype)."""
    import cudashim as shim
    from cudashim import speedups
    if speedups.chosen(shim._settings.load()) is None:
        pytest.skip("the compiled fast path does not run here")
    shim.activate("cpu")
    gate = torch.abs
    assert type(gate).__name__ == "DtypeGate" and gate.__name__ == "abs"
    assert gate.cudashim_gap_dtypes == gate.python_twin.cudashim_gap_dtypes
    original = shim.get_original(torch, "abs")
    flags, x = torch.tensor([True, False]), torch.tensor([-1.5, 2.0])
    assert torch.equal(gate(x), original(x)) and not gate.gap_seen
    calls = [((flags,), {}), ((), {"input": flags}), ((x,), {}), ((), {"input": x}),
             ((x,), {"out": torch.empty(2)}), ((flags,), {"out": torch.empty(2, dtype=torch.bool)})]
    for args, kwargs in calls:
        got, twin = gate(*args, **kwargs), gate.python_twin(*args, **kwargs)
        assert torch.equal(got, twin) and got.dtype == twin.dtype, (args, kwargs)
    assert gate.gap_seen
    assert torch.equal(gate(x), original(x))
    assert flags.abs().dtype == torch.bool and torch.equal(x.abs(), original(x))
    compiled = torch.compile(lambda m, v: torch.abs(m).sum() + torch.abs(v).sum(), backend="eager")
    assert compiled(flags, x).item() == 4.5


@pytest.mark.parametrize("pure_python", [False, True])
def test_an_error_outside_the_gap_is_the_ops_own(pure_python):
    """A refused call with nothing in the gap raises what the op raised, unchanged, before and
    after the function was called in its gap."""
    import cudashim as shim
    shim.activate("cpu", pure_python=pure_python)
    original = shim.get_original(torch, "histc")
    for first in (True, False):
        with pytest.raises(RuntimeError) as ours:
            torch.histc(torch.randn(4), bins=-1)
        with pytest.raises(RuntimeError) as theirs:
            original(torch.randn(4), bins=-1)
        assert str(ours.value) == str(theirs.value)
        if first:
            counts = torch.histc(torch.tensor([1, 2, 2, 3]), bins=3, min=1, max=3)   # into the gap
            assert counts.tolist() == [1, 2, 1] and counts.dtype == torch.int64
    with pytest.raises(TypeError):
        torch.abs("not a tensor")


def test_the_pure_python_setting_fills_gaps_with_python_functions():
    import types

    import cudashim as shim
    shim.activate("cpu", pure_python=True)
    assert isinstance(torch.abs, types.FunctionType)
    assert torch.equal(torch.abs(torch.tensor([True, False])), torch.tensor([True, False]))


def test_sparse_and_nested_layouts_are_served_only_where_the_target_has_no_kernels_for_them():
    """The CPU has sparse and nested kernels, so the layouts group registers and patches nothing
    there; a PrivateUse1 device without kernels of its own gets COO's constructors on its sparse
    key, the conversions on its dense key, every compressed op on its SparseCsr key, and the
    encoder's padded path."""
    import cudashim
    from cudashim.patches import layouts
    accelerator = torch._C._get_privateuse1_backend_name()
    assert layouts.missing_kernels("cpu") == {} and not layouts.lacks_nested_tensors("cpu")
    assert layouts.missing_kernels(accelerator) == {
        "SparsePrivateUse1": list(layouts.COO_CONSTRUCTORS),
        "PrivateUse1": list(layouts.CONVERSIONS + layouts.COMPRESSED_CONVERSIONS)}
    assert layouts.lacks_nested_tensors(accelerator)
    assert layouts.layouts_held(accelerator) == ["sparse COO", "CSR, CSC, BSR and BSC"]
    assert layouts.missing_compressed_kernels("cpu") == []
    assert "crow_indices" in layouts.missing_compressed_kernels(accelerator)
    forward, from_mask = torch.nn.TransformerEncoder.forward, torch._nested_tensor_from_mask
    cudashim.activate("cpu")
    assert torch.nn.TransformerEncoder.forward is forward and torch._nested_tensor_from_mask is from_mask
    assert not torch._C._dispatch_has_kernel_for_dispatch_key(
        f"aten::{layouts.COO_CONSTRUCTORS[0]}", "SparsePrivateUse1")


@pytest.mark.torch_range
def test_the_compressed_layouts_table_has_every_op_torch_computes_on_them():
    """Every op this torch has a host kernel for on the compressed layouts (its ``SparseCsrCPU``
    key) is in the table a target without them gets a kernel from: the next torch's new one
    fails here, not in a program."""
    from cudashim.tables import compressed_layouts
    on_them = {name[len("aten::"):] for name in torch._C._dispatch_get_all_op_names()
               if name.startswith("aten::")
               and torch._C._dispatch_has_kernel_for_dispatch_key(name, "SparseCsrCPU")}
    assert on_them and on_them <= set(compressed_layouts.OPS), sorted(on_them - set(compressed_layouts.OPS))
    assert set(compressed_layouts.ON_THE_DEVICE) <= set(compressed_layouts.OPS)
