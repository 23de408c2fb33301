"""torch.compile of shimmed code: torch's internals must hear the truth (a CPU is not CUDA)."""

from conftest import python

SNIPPET = """
import torch
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU()).cuda()
x = torch.randn(4, 8, device="cuda")
assert torch.cuda.is_available()
y = torch.compile(m)(x)
y.sum().backward()
print(torch.allclose(y, m(x)), y.is_cuda, m[0].weight.grad is not None)
"""


def test_torch_compile_inductor_runs_under_the_shim():
    result = python("-m", "cudashim", "-c", SNIPPET, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["True", "True", "True"]



def test_the_shim_adds_no_graph_break_to_the_gpt_example(tmp_path):
    """torch._dynamo.explain of the example's model: under the shim, the same one graph
    with the same ops as the hand port, and no break."""
    import json
    explain = "tests/programs/explain_gpt.py"
    shimmed = python("-m", "cudashim", "--amp-dtype", "as-asked", explain, "examples/gpt.py", "cuda",
                     str(tmp_path / "a.pt"))
    ported = python(explain, "tests/ported/gpt_ported.py", "cpu", str(tmp_path / "b.pt"))
    assert shimmed.returncode == 0 and ported.returncode == 0, shimmed.stderr[-2000:] + ported.stderr[-2000:]
    a, b = (json.loads(r.stdout.splitlines()[-1]) for r in (shimmed, ported))
    assert a["breaks"] == 0, a["reasons"]
    assert a == b and a["graphs"] == 1
    # by default float16 computes in float32 on a CPU that emulates it: still one graph, no break
    default = python("-m", "cudashim", "--host-profile", "slow", explain, "examples/gpt.py", "cuda",
                     str(tmp_path / "c.pt"))
    assert default.returncode == 0, default.stderr[-2000:]
    c = json.loads(default.stdout.splitlines()[-1])
    assert c["breaks"] == 0 and c["graphs"] == 1, c["reasons"]


CUDA_IN_COMPILED_CODE = """
import json, torch
def step(x):
    y = torch.arange(3, device=x.device) + x.to(x.device) + x.cuda() + x.to("cuda") + x.to(0)
    y = y + torch.ones(3, device=torch.device("cuda")) + torch.zeros(3, device="cuda:0")
    return y * 2 if x.is_cuda else y
x = torch.ones(3, device="cuda")
explanation = torch._dynamo.explain(step)(x)
compiled = torch.compile(step, backend="eager")(x)
print(json.dumps([explanation.graph_count, explanation.graph_break_count, compiled.tolist(), step(x).tolist()]))
"""


def test_cuda_device_vocabulary_inside_compiled_code_adds_no_graph_break():
    """Device objects, strings, indices, .cuda() and is_cuda inside a compiled function."""
    import json
    result = python("-m", "cudashim", "-c", CUDA_IN_COMPILED_CODE)
    assert result.returncode == 0, result.stderr[-3000:]
    graphs, breaks, compiled, eager = json.loads(result.stdout.splitlines()[-1])
    assert (graphs, breaks) == (1, 0)
    assert compiled == eager == [10.0, 12.0, 14.0]


COMPILED_UNDER_THE_DEFAULT_DEVICE = """
import json, torch
def step(x):
    return (x.float() + torch.ones(3)) * torch.arange(3)
torch.set_default_device("cuda")
x = torch.ones(3, dtype=torch.bfloat16)
explanation = torch._dynamo.explain(step)(x)
compiled = torch.compile(step, backend="eager")(x)
torch.set_default_device("cpu")
with torch.device("cuda"):
    inside = torch.compile(step, backend="eager", dynamic=True)(torch.ones(3, device="cuda"))
    made = torch.zeros(1024)
print(json.dumps([explanation.graph_count, explanation.graph_break_count, compiled.tolist(), compiled.is_cuda,
                  inside.tolist(), step(x.cuda()).tolist(), torch.cuda.memory_allocated() >= made.nbytes]))
"""


def test_code_compiled_under_the_default_device_traces_as_it_does_on_cuda():
    """``torch.set_default_device("cuda")`` and ``with torch.device("cuda")`` (nano-vllm, gpt-fast
    and torchtitan build and warm up their models so) around a compiled function that makes a
    tensor: one graph, no break, the values eager computes on the target; a tensor the context
    makes eagerly is still counted as device memory."""
    import json
    result = python("-m", "cudashim", "-c", COMPILED_UNDER_THE_DEFAULT_DEVICE, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    graphs, breaks, compiled, on_target, inside, eager, counted = json.loads(result.stdout.splitlines()[-1])
    assert (graphs, breaks) == (1, 0)
    assert compiled == inside == eager == [0.0, 2.0, 4.0]
    assert on_target and counted


REPLACED_METHODS_UNDER_THE_DEFAULT_DEVICE = """
import copy, json, torch
def step(x):
    y = (x.float() + torch.ones(3)) * torch.arange(3)
    return y.to(torch.float16).abs().matmul(2 * torch.eye(3, dtype=torch.float16)).to(torch.float32)
def with_breaks(x):
    y = copy.deepcopy(x * 2)             # the standard library's: dynamo runs it as it is
    return y + torch.tensor(y.tolist())  # a graph break, and a guard on each value
torch.set_default_device("cuda")
x = torch.ones(3, dtype=torch.bfloat16)
explanation = torch._dynamo.explain(step)(x)
compiled = torch.compile(step, backend="eager")(x)
broken = torch.compile(with_breaks, backend="eager")
for value in range(12):
    last = broken(torch.full((3,), float(value)))
print(json.dumps([torch.Tensor.matmul is not torch._C.TensorBase.matmul, explanation.graph_count,
                  explanation.graph_break_count, compiled.tolist(), step(x).tolist(), last.tolist()]))
"""


def test_tensor_methods_cudashim_replaced_compile_under_the_default_device_as_torchs_own():
    """Under ``torch.set_default_device("cuda")`` dynamo hands the device's torch function mode
    the method a Tensor method call names: for one cudashim replaced (``Tensor.to``, a float16
    matmul the host computes widened), torch's own, one graph with no break, as without the mode
    (each was a graph break, and the policy's buffers broke the trace). And cudashim's frame
    in that mode runs as it is where code a compiled function leaves to run eagerly makes tensors
    (dynamo compiled it afresh for each op, up to its recompile limit, with its warning)."""
    import json
    result = python("-m", "cudashim", "-c", REPLACED_METHODS_UNDER_THE_DEFAULT_DEVICE, timeout=600,
                    env={"CUDASHIM_HOST_PROFILE": "slow", "TORCH_LOGS": "recompiles"})
    assert result.returncode == 0, result.stderr[-3000:]
    replaced, graphs, breaks, compiled, eager, last = json.loads(result.stdout.splitlines()[-1])
    assert replaced, "the slow host's policy widens a float16 matmul: Tensor.matmul is replaced"
    assert (graphs, breaks) == (1, 0)
    assert compiled == eager == [0.0, 4.0, 8.0]
    assert last == [44.0, 44.0, 44.0]
    recompiled = [line for line in result.stderr.splitlines() if "Recompiling function" in line]
    assert any("with_breaks" in line for line in recompiled), result.stderr[-3000:]   # logged
    assert not any("__torch_function__" in line for line in recompiled), recompiled
