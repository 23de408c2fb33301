"""The torch-range set: what every torch release cudashim supports must run, end to end.

CI runs the tests marked ``torch_range`` (these, and the cases elsewhere that carry the mark) on
the oldest torch the package declares, on one the vendors' extensions pin and on the newest the
package index serves, each the CUDA build pip installs on a machine without a GPU
(``tox -e torch2.4,torch2.7,torch2.14``), as well as in the main suite on the pinned CPU wheel.
"""

import json
import sys

import pytest

from conftest import explained_and_compiled, python, torchrun
from targets import SHIMDEV

pytestmark = pytest.mark.torch_range


def _train(tmp_path, name, shim_options, program_options):
    result = python("-m", "cudashim", "--report", *shim_options, "tests/programs/mixed_precision_train.py",
                    "--checkpoint", str(tmp_path / f"{name}.pt"), *program_options, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr


@pytest.mark.parametrize("scaler", ["torch.amp", "torch.cuda.amp"])
def test_mixed_precision_training_with_workers_compile_script_and_a_checkpoint(tmp_path, scaler):
    """One run per target serves every assertion: a DataLoader with workers and pinned memory,
    float16 autocast with the GradScaler spelled either way, torch.compile (for one spelling),
    a TorchScript'd loss, map_location to the host and to "cuda:0", and the report."""
    options = ["--scaler", scaler] + (["--compile"] if scaler == "torch.amp" else [])
    on_cpu, report = _train(tmp_path, "cpu", ["--host-profile", "slow"], options)
    assert "cudashim report" in report and "GradScaler" in report, report[-2000:]
    assert on_cpu["host_devices"] == ["cpu"] and on_cpu["is_cuda"]
    assert on_cpu["losses"][-1] < on_cpu["losses"][0], "it should learn"

    if SHIMDEV.why_not is not None:
        pytest.skip(f"the test accelerator: {SHIMDEV.why_not}")
    on_device, _ = _train(tmp_path, "shimdev", ["--host-profile", "slow", *SHIMDEV.options], options)
    assert on_device["host_devices"] == ["cpu"]
    assert on_device["resumed_devices"] == on_device["parameters_on"] == ["shimdev:0"]
    assert on_device["is_cuda"]
    assert on_device["losses"] == pytest.approx(on_cpu["losses"], rel=1e-3, abs=1e-4)
    assert on_device["scale"] == on_cpu["scale"]


def test_a_library_built_for_this_torchs_cuda_hears_it_and_imports(tmp_path):
    """A library built for this torch checks at import that torch's CUDA major version is the one
    it was compiled with, as torchvision and torchaudio do ("PyTorch and torchvision were compiled
    with different CUDA major versions"): under the shim the program and it hear this torch's own
    CUDA version where torch is a CUDA build (on the CUDA 13 build of torch 2.14 a fixed 12.8
    stopped ``import torchvision``), 12.8 where it is not, and the setting's where one is given."""
    import os

    import torch

    built = torch.version.cuda
    (tmp_path / "visionlike.py").write_text(
        "import torch\n"
        f"BUILT_WITH = {built!r}\n"
        "if BUILT_WITH is not None and torch.version.cuda.split('.')[0] != BUILT_WITH.split('.')[0]:\n"
        "    raise RuntimeError(f'compiled with different CUDA major versions: {torch.version.cuda}')\n")
    program = "import visionlike, torch; print(torch.version.cuda, torch.backends.cudnn.version())"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tmp_path), os.environ.get("PYTHONPATH"))))}
    heard = python("-m", "cudashim", "-c", program, env=env)
    assert heard.returncode == 0, heard.stderr[-3000:]
    version, cudnn = heard.stdout.split()
    assert version == (built or "12.8") and int(cudnn) >= 90000
    told = python("-m", "cudashim", "--cuda-version", "12.6", "-c",
                  "import torch; print(torch.version.cuda)", env=env)
    assert told.returncode == 0 and told.stdout.strip() == "12.6", told.stderr[-3000:]


def test_the_doctor_says_whether_this_torch_is_in_the_tested_range():
    import torch

    from cudashim import torch_range

    result = python("-c", "from cudashim.cli import main; main()", "doctor")
    assert result.returncode == 0, result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("torch "))
    assert torch_range.describe(torch.__version__) in line, line
    where = torch_range.release(torch.__version__)
    assert ("tested by CI" in line) == (where in torch_range.TESTED), line


def test_where_a_torch_stands_in_the_range():
    from cudashim import torch_range

    assert torch_range.describe("2.4.1+cu121").startswith("tested by CI")
    assert torch_range.describe("2.5.1").startswith("inside the tested range")
    assert torch_range.describe("2.3.1").startswith("older than")
    assert torch_range.describe("2.15.0").startswith("newer than")
    assert torch_range.describe("2.15.0a0+git1234").startswith("newer than")
    assert torch_range.describe("2.14.0").startswith("inside")


def test_the_proxy_torch_cuda_looks_like_this_torchs_where_torch_and_libraries_inspect_it(shim):
    """For every public name of this torch's torch.cuda and its submodules (the surface read
    from the installed torch, not from a table of one release's): a function stays a function
    carrying the real one's name, qualified name, module, docstring and signature, and a
    ``__wrapped__`` where the real one has one (torch 2.14's dynamo reads
    ``torch.cuda.use_mem_pool.__wrapped__`` when imported); a class stays a class; a context
    manager class stays one."""
    import inspect
    import types

    import torch

    from cudashim.tables import cuda_surface

    real_top = torch.cuda._cudashim_real
    compared, wrong = 0, []
    for real in cuda_surface.real_submodules(real_top):
        proxy = torch.cuda if real is real_top else sys.modules[real.__name__]
        for name in cuda_surface.public_names(real):
            value, ours = getattr(real, name), getattr(proxy, name)
            where = f"{real.__name__}.{name}"
            compared += 1
            if isinstance(value, types.ModuleType) or ours is value:
                continue
            if isinstance(value, type):
                if not isinstance(ours, type):
                    wrong.append(f"{where}: a class became {type(ours).__name__}")
                elif hasattr(value, "__enter__") and not hasattr(ours, "__enter__"):
                    wrong.append(f"{where}: a context manager class lost __enter__")
                continue
            if not callable(value):
                continue
            if isinstance(ours, type) or not callable(ours):
                wrong.append(f"{where}: a function became {type(ours).__name__}")
                continue
            for attribute in ("__name__", "__qualname__", "__module__", "__doc__"):
                if getattr(ours, attribute, None) != getattr(value, attribute, None):
                    wrong.append(f"{where}: {attribute} {getattr(ours, attribute, None)!r} "
                                 f"!= {getattr(value, attribute, None)!r}")
            if hasattr(value, "__wrapped__") and not hasattr(ours, "__wrapped__"):
                wrong.append(f"{where}: no __wrapped__")
            try:
                expected = inspect.signature(value)
            except (TypeError, ValueError):        # a builtin without a text signature
                continue
            if inspect.signature(ours) != expected:
                wrong.append(f"{where}: signature {inspect.signature(ours)} != {expected}")
    assert compared > 100, compared
    assert not wrong, "\n".join(wrong)


def test_dynamo_imports_under_the_shim_and_compiles_a_cuda_function(shim):
    """torch 2.14's dynamo reads torch.cuda.use_mem_pool.__wrapped__ at import; torch 2.4's
    asserts that torch.cuda.Event and Stream derive from its stream bases."""
    import torch
    import torch._dynamo  # noqa: F401

    @torch.compile(backend="eager")
    def scaled(x):
        return x * 2 if x.is_cuda else x

    assert scaled(torch.ones(2, device="cuda")).tolist() == [2.0, 2.0]


def test_a_float16_model_under_torch_compile_is_one_graph_on_every_torch(shim):
    """A ``.half().cuda()`` model (linear layers, attention, a convolution, a product) under
    torch.compile, with the precision policy this host's speeds choose: its calls trace as torch
    ops, one graph without a break, and the compiled results are the eager ones' to the policy's
    rounding. torch 2.4 ran the layers on fake tensors into the policy's compiled conversions and
    failed ("Cannot access data pointer"); the later ones broke the graph at every call."""
    import torch
    import torch.nn.functional as F

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.projection, self.convolution = torch.nn.Linear(32, 96), torch.nn.Conv2d(4, 4, 3, padding=1)

        def forward(self, x, image):
            q, k, v = self.projection(x).view(2, 8, 3, 4, 8).permute(2, 0, 3, 1, 4)
            attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return attended, torch.matmul(attended, attended.transpose(-1, -2)), self.convolution(image)

    torch.manual_seed(0)
    block = Block().half().cuda().eval()
    x, image = torch.randn(2, 8, 32, device="cuda").half(), torch.randn(2, 4, 6, 6, device="cuda").half()
    eager, _, compiled = explained_and_compiled(block, x, image)
    for ours, theirs in zip(compiled, eager):
        assert ours.dtype == torch.float16 and ours.is_cuda
        torch.testing.assert_close(ours.float(), theirs.float(), rtol=2 ** -6, atol=2 ** -6)
    torch._dynamo.trace_rules.clear_lru_cache()         # as init_process_group calls it
    torch._dynamo.reset()
    with torch.no_grad():
        assert torch._dynamo.explain(block)(x, image).graph_count == 1


def _averaged(tmp_path, name, shim_options=()):
    result = torchrun("tests/programs/averages.py", "--out", str(tmp_path / name), shim_options=shim_options)
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((tmp_path / f"{name}.rank{rank}.json").read_text()) for rank in (0, 1)]


def test_averages_and_reduce_scatters_are_nccls_on_every_torch(tmp_path):
    """NCCL averages every tensor it reduces (integers truncated) and reduce-scatters a list.
    Gloo refuses integer averages on every torch; torch 2.7 and earlier also refuse float
    averages in all_reduce and reduce, return the sum from an averaging reduce_scatter_tensor,
    and have no list-form reduce_scatter. On groups made for NCCL the program gets NCCL's
    answers on every torch and target, on a DeviceMesh's subgroups too; a gloo group it made
    itself keeps gloo's refusal."""
    runs = {"cpu": _averaged(tmp_path, "cpu")}
    if SHIMDEV.why_not is None:
        runs["shimdev"] = _averaged(tmp_path, "shimdev", SHIMDEV.options)
    for target, ranks in runs.items():
        for rank, seen in enumerate(ranks):
            assert seen["all_reduce"] == [[5, -5, 3], "torch.int64"], target
            assert seen["all_reduce_async"] == [3], target
            assert seen["reduce_scatter_tensor"] == [[5, 6], [7, 8]][rank], target
            if rank == 1:                   # reduce's result is the destination's only
                assert seen["reduce_to_rank_1"] == [9], target
            for dtype in ("float32", "bfloat16"):
                assert seen[f"all_reduce {dtype}"] == [[1.5, 1.0], f"torch.{dtype}"], (target, dtype)
                assert seen[f"reduce_scatter_tensor {dtype}"] == [[0.0, 1.5], [3.0, 4.5]][rank], (target, dtype)
                if rank == 0:
                    assert seen[f"reduce_to_rank_0 {dtype}"] == [2.0], (target, dtype)
            assert seen["reduce_scatter of a list"] == [[1.0, 1.0], [21.0, 21.0]][rank], target
            assert seen["reduce_scatter of a list, averaged"] == [[0.5, 0.5], [10.5, 10.5]][rank], target
            assert seen["mesh subgroup"] == [4], target
            own = seen["own_gloo_group"]
            assert "can't be cast to the desired output type Long" in own \
                or "Cannot use ReduceOp.AVG with Gloo" in own, (target, own)
