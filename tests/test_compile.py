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
