"""Long norms and dots on the CPU backend are as exact as CUDA's: the calls real programs make
(a flattened gradient's norm, clip_grad_norm_ over one big parameter, F.normalize along a long
row, a dot of two flattened buffers), against float64, within what CUDA's tree reductions give
(about 1e-7; bounded here at 1e-6, where torch's CPU kernels are off by 1e-5 to 1e-3)."""

import math

import pytest
import torch
import torch.nn.functional as F

pytestmark = pytest.mark.host          # torch's kernels differ by instruction set: pinned per host

LONG = 2 ** 23 + 37                    # past both blocking lengths, and not a whole block
CUDA_LIKE = 1e-6


def _relative(value, reference):
    value, reference = value.double(), reference.double()
    return ((value - reference).abs().max() / reference.abs().max()).item()


def _long(n=LONG, seed=0):
    """Positive values: every rounding adds up, the hardest case for a running sum."""
    generator = torch.Generator().manual_seed(seed)
    return torch.rand(n, generator=generator).add_(0.5).to("cuda")


def _clipped_norm(x, foreach):
    parameter = torch.nn.Parameter(torch.zeros_like(x))
    parameter.grad = x.clone()
    small = torch.nn.Parameter(torch.zeros(3, device="cuda"))
    small.grad = torch.ones(3, device="cuda")
    return torch.nn.utils.clip_grad_norm_([parameter, small], max_norm=1e9, foreach=foreach)


NORMS = {   # name -> (x -> float32 result, x -> the same in float64)
    "vector_norm": lambda x: torch.linalg.vector_norm(x),
    "Tensor.norm": lambda x: x.norm(),
    "torch.norm(p=2)": lambda x: torch.norm(x, p=2),
    "Tensor.norm(p=1)": lambda x: x.norm(p=1),
    "vector_norm(ord=3)": lambda x: torch.linalg.vector_norm(x, ord=3),
    "linalg.norm": lambda x: torch.linalg.norm(x),
    "linalg.norm(fro) of a matrix": lambda x: torch.linalg.norm(x[:2 ** 22].view(2 ** 11, -1), "fro"),
    "norm over the last dim, keepdim": lambda x: x[:2 ** 22].view(4, -1).norm(dim=-1, keepdim=True),
    "F.normalize along a long row": lambda x: F.normalize(x[:2 ** 22].view(2, -1), dim=1)[:, :5],
    "_foreach_norm": lambda x: torch._foreach_norm([x, x[:10]])[0],
    "clip_grad_norm_ (foreach)": lambda x: _clipped_norm(x, True),
    "clip_grad_norm_ (per tensor)": lambda x: _clipped_norm(x, False),
    "dist": lambda x: torch.dist(x, x.flip(0) * 0.5),
    "F.cosine_similarity of two flattened buffers": lambda x: F.cosine_similarity(x, x.flip(0).sqrt(), dim=0),
    "nn.CosineSimilarity along a long row": lambda x: torch.nn.CosineSimilarity(dim=-1)(
        x[:2 ** 22].view(2, -1), x[:2 ** 22].view(2, -1).flip(0).sqrt()),
    "dot": lambda x: torch.dot(x, _long(seed=1).to(x.dtype)),
    "Tensor.dot": lambda x: x.dot(_long(seed=1).to(x.dtype)),
    "vdot": lambda x: torch.vdot(x, _long(seed=1).to(x.dtype)),
    "mv": lambda x: torch.mv(torch.stack([x, _long(seed=1).to(x.dtype)]), x),
}


@pytest.mark.parametrize("name", NORMS)
def test_long_reductions_are_as_exact_as_cudas(shim, name):
    x = _long()
    result = NORMS[name](x)
    reference = NORMS[name](x.double())
    assert result.dtype == torch.float32 and result.shape == reference.shape and result.is_cuda
    assert _relative(result, reference) < CUDA_LIKE, name


def _sums(x, y):
    """Every kind of long sum the compiled kernels take, as programs call them."""
    return {"1-norm": x.norm(p=1), "2-norm": torch.linalg.vector_norm(x),
            "2-norms of rows": x[:2 ** 22].view(4, -1).norm(dim=-1),
            "1-norms of rows, keepdim": torch.linalg.vector_norm(x[:2 ** 22].view(2, -1), 1, -1, True),
            "clip_grad_norm_": _clipped_norm(x, True), "dist": torch.dist(x, y),
            "dist(p=1)": torch.dist(x, y, 1), "dot": torch.dot(x, y),
            "cosine along a row": F.cosine_similarity(x[:2 ** 22].view(2, -1), y[:2 ** 22].view(2, -1), dim=-1)}


def test_the_compiled_sums_give_the_same_bits_on_every_instruction_set_and_torchs_blocks_agree(shim):
    """Each variant of the compiled kernels this CPU runs sums in the same order of operations,
    so gives the same bits, within CUDA's bound of float64; the portable path (torch's blocks, as
    under --pure-python) is within twice that."""
    from cudashim.kernels import native
    if not native.usable():
        pytest.skip("the compiled kernels do not run here")
    x, y = _long(), _long(seed=1)
    by_variant = {}
    for variant in native.variants():
        if variant.runs_here:
            with native.using_variant(variant.name):
                by_variant[variant.name] = _sums(x, y)
    with native.portable_only():
        blocked = _sums(x, y)
    reference = _sums(x.double(), y.double())
    first, *others = by_variant.values()
    for name, value in first.items():
        assert value.dtype == torch.float32 and value.shape == reference[name].shape, name
        assert all(torch.equal(value, other[name]) for other in others), name
        assert _relative(value, reference[name]) < CUDA_LIKE, name
        # torch's blocks of a 1-norm sum each block in one float32 lane: about 1.1e-6 here
        assert _relative(blocked[name], reference[name]) < 2 * CUDA_LIKE, name


def test_distances_and_long_one_norms_are_exact_from_where_the_norms_drift(shim):
    """torch.dist drifts as a norm does from 2**20 elements (1e-5 there), and a 1-norm summed
    over blocks of torch's kernel still drifts at 2**24 (1.5e-6): both within CUDA's bound now."""
    x, y = _long(2 ** 21 + 3), _long(2 ** 21 + 3, seed=1)
    for p in (1, 2):
        assert _relative(torch.dist(x, y, p), torch.dist(x.double(), y.double(), p)) < CUDA_LIKE, p
    big = _long(2 ** 24 + 5)
    assert _relative(big.norm(p=1), big.double().norm(p=1)) < CUDA_LIKE


def test_a_long_sum_keeps_what_torch_keeps_of_nans_and_infinities(shim):
    x = _long()
    for bad, norm in ((float("nan"), float("nan")), (float("inf"), float("inf")), (-float("inf"), float("inf"))):
        poisoned = x.clone()
        poisoned[12345] = bad
        for value in (poisoned.norm(), poisoned.norm(p=1), torch.dist(poisoned, x)):
            assert math.isnan(value.item()) if math.isnan(norm) else value.item() == norm, (bad, value)
        product = torch.dot(poisoned, x).item()
        assert math.isnan(product) if math.isnan(bad) else product == bad


def test_blocked_norms_keep_shapes_dtypes_and_gradients(shim):
    x = _long()[: 2 ** 22].view(2, 2, -1)
    for dim, keepdim in ((None, False), (-1, True), ((1, 2), False), ([-1, -2], True)):
        expected = torch.linalg.vector_norm(x.double(), 2, dim, keepdim).float()
        result = torch.linalg.vector_norm(x, 2, dim, keepdim)
        assert result.shape == expected.shape and _relative(result, expected) < CUDA_LIKE, (dim, keepdim)
    half = x.bfloat16()
    assert half.norm().dtype == torch.bfloat16
    assert torch.linalg.vector_norm(half, dtype=torch.float32).dtype == torch.float32
    assert _relative(torch.linalg.vector_norm(half, dtype=torch.float32), half.double().norm()) < CUDA_LIKE
    leaf = x.clone().requires_grad_()
    leaf.norm().backward()
    assert _relative(leaf.grad, x.double() / x.double().norm()) < CUDA_LIKE
    rows = x.clone().requires_grad_()
    torch.linalg.vector_norm(rows, 3, dim=-1).sum().backward()
    exact = rows.detach().double()
    expected_grad = exact.pow(2) / torch.linalg.vector_norm(exact, 3, -1, True).pow(2)
    assert _relative(rows.grad, expected_grad) < 8 * CUDA_LIKE    # a chain of elementwise roundings
    a, b = _long(seed=1).requires_grad_(), _long(seed=2)
    torch.dot(a, b).backward()
    assert torch.equal(a.grad, b)


def test_every_other_call_is_torchs_own(shim):
    """Short reductions, orders that are exact as they are, float64 accumulation, out=,
    strided inputs and integer-free dtypes go to torch's kernel: the same bits."""
    import cudashim
    vector_norm = cudashim.get_original(torch.linalg, "vector_norm")
    dot = cudashim.get_original(torch, "dot")
    x = _long()
    short = x[:1000]
    assert torch.equal(torch.linalg.vector_norm(short), vector_norm(short))
    assert torch.equal(short.norm(), vector_norm(short))
    for order in (0, math.inf, -math.inf):
        assert torch.equal(torch.linalg.vector_norm(x, order), vector_norm(x, order))
    assert torch.equal(torch.linalg.vector_norm(x, dtype=torch.float64), vector_norm(x, dtype=torch.float64))
    strided = x[: 2 ** 22].view(-1, 2)[:, 0]
    assert torch.equal(strided.norm(), vector_norm(strided))
    columns = x[: 2 ** 22].view(-1, 4)
    assert torch.equal(columns.norm(dim=0), vector_norm(columns, dim=0))
    out = torch.empty(())
    torch.linalg.vector_norm(x, out=out)
    assert torch.equal(out, vector_norm(x))
    assert torch.equal(torch.dot(short, short), dot(short, short))
    doubles = x.double()
    assert torch.equal(torch.dot(doubles, doubles), dot(doubles, doubles))
    with pytest.raises(RuntimeError):                   # torch's own refusal
        torch.dot(x, x[:-1])


def test_norms_and_dots_given_their_tensors_by_keyword_are_computed_as_given_by_position(shim):
    """torch takes these tensors by keyword too (``torch.dot(input=a, tensor=b)``, NumPy's
    ``x=``, a Tensor method's ``vec=``): long ones are blocked as their positional calls are,
    short ones are torch's own, and a call without its tensor fails as torch's does."""
    x, y = _long(), _long(seed=1)
    rows, short = torch.stack([x, y]), x[:1000]
    forms = {   # name -> (by keyword, by position)
        "dot": (lambda: torch.dot(input=x, tensor=y), lambda: torch.dot(x, y)),
        "dot, second by keyword": (lambda: torch.dot(x, tensor=y), lambda: torch.dot(x, y)),
        "Tensor.dot": (lambda: x.dot(tensor=y), lambda: x.dot(y)),
        "vdot": (lambda: torch.vdot(input=x, other=y), lambda: torch.vdot(x, y)),
        "mv": (lambda: torch.mv(input=rows, vec=x), lambda: torch.mv(rows, x)),
        "Tensor.mv": (lambda: rows.mv(vec=x), lambda: rows.mv(x)),
        "dist": (lambda: torch.dist(input=x, other=y * 0.5), lambda: torch.dist(x, y * 0.5)),
        "vector_norm(input=)": (lambda: torch.linalg.vector_norm(input=x), lambda: torch.linalg.vector_norm(x)),
        "vector_norm(x=)": (lambda: torch.linalg.vector_norm(x=x, ord=1), lambda: torch.linalg.vector_norm(x, 1)),
        "linalg.norm": (lambda: torch.linalg.norm(input=x), lambda: torch.linalg.norm(x)),
        "_foreach_norm": (lambda: torch._foreach_norm(self=[x, short])[0], lambda: torch._foreach_norm([x, short])[0]),
        "cosine_similarity": (lambda: torch.cosine_similarity(x1=x, x2=y, dim=0),
                              lambda: torch.cosine_similarity(x, y, 0)),
        "short dot": (lambda: torch.dot(input=short, tensor=short), lambda: torch.dot(short, short)),
    }
    for name, (by_keyword, by_position) in forms.items():
        assert torch.equal(by_keyword(), by_position()), name
    reference = torch.dot(x.double(), y.double())
    assert _relative(torch.dot(input=x, tensor=y), reference) < CUDA_LIKE
    with pytest.raises(TypeError):
        torch.dot(tensor=y)


def test_deactivation_gives_back_torchs_functions():
    import cudashim
    originals = (torch.linalg.vector_norm, torch.linalg.norm, torch._foreach_norm, torch.dist,
                 torch.dot, torch.mv, torch.Tensor.dot)
    cudashim.activate("cpu")
    assert torch.linalg.vector_norm is not originals[0]
    cudashim.deactivate()
    assert (torch.linalg.vector_norm, torch.linalg.norm, torch._foreach_norm, torch.dist,
            torch.dot, torch.mv, torch.Tensor.dot) == originals


def test_a_compiled_program_traces_through_the_blocked_norm(shim):
    """One graph (fullgraph) through the wrapper; the numbers are then inductor's own code's,
    as they are on CUDA (on torch 2.4 about 2.5e-6 here: a bound ten times looser)."""
    x = _long()
    compiled = torch.compile(lambda t: t.norm() / math.sqrt(t.numel()), fullgraph=True)
    assert _relative(compiled(x), x.double().norm() / math.sqrt(x.numel())) < 10 * CUDA_LIKE


def test_where_the_fast_path_runs_each_call_is_its_compiled_gate_and_agrees_with_python(shim):
    """Each gated function is a compiled gate carrying its Python twin: both give the same
    result on short calls, long ones, keyword inputs and torch's own refusals, and a short
    call never enters the twin (no Python frame: the point of the gate)."""
    from cudashim import speedups
    import cudashim
    if speedups.chosen(cudashim._settings.load()) is None:
        pytest.skip("the compiled fast path does not run here")
    gates = {"vector_norm": torch.linalg.vector_norm, "linalg.norm": torch.linalg.norm,
             "dist": torch.dist, "dot": torch.dot, "Tensor.dot": torch.Tensor.dot, "mv": torch.mv,
             "cosine_similarity": F.cosine_similarity}
    for name, gate in gates.items():
        assert type(gate).__name__ == "LengthGate" and callable(gate.python_twin), name
    x, short = _long(), _long(1000)
    other = _long(seed=3)
    calls = {
        "vector_norm": [((x,), {}), ((short,), {}), ((x, 1), {"dim": 0}), ((), {"x": x}),
                        ((short, "fro"), {})],
        "linalg.norm": [((x,), {}), ((short,), {}), ((x[:2 ** 22].view(4, -1),), {"dim": -1})],
        "dist": [((x, other), {}), ((short, short.flip(0)), {}), ((short[:1], x), {})],
        "dot": [((x, other), {}), ((short, short), {}), ((x, other[:-1]), {})],
        "Tensor.dot": [((x, other), {}), ((short, short), {})],
        "mv": [((torch.stack([x, other]), x), {}), ((short.view(10, 100), short[:100]), {})],
        "cosine_similarity": [((x, other), {"dim": 0}), ((short, short), {"dim": 0})],
    }
    for name, gate in gates.items():
        for args, kwargs in calls[name]:
            results = []
            for call in (gate, gate.python_twin):
                try:
                    results.append(("value", call(*args, **kwargs)))
                except Exception as exc:                 # the refusal is part of the behaviour
                    results.append(("raised", type(exc), str(exc)))
            compiled, python = results
            if compiled[0] == "raised":
                assert compiled == python, name
            else:
                assert python[0] == "value" and torch.equal(compiled[1], python[1]), name
    assert _python_frames(lambda: torch.linalg.vector_norm(short)) == []
    assert "accurate_vector_norm" in _python_frames(lambda: torch.linalg.vector_norm(x))


def _python_frames(call):
    """The Python functions a call enters (their code names)."""
    import sys
    entered = []

    def profile(frame, event, arg):
        if event == "call":
            entered.append(frame.f_code.co_name)
    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
    return [name for name in entered if name != "<lambda>"]
