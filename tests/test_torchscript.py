"""TorchScript under the shim: scripted functions, classes and modules compile against the
patched torch and run on the target; tracing, saving and loading work; deactivation leaves
TorchScript's tables as they were."""

from typing import List, Optional

import pytest
import torch


def to_device(x: torch.Tensor, device: torch.device):
    """Annotated before activation: the annotation is the real torch.device class."""
    return x.to(device)


def import_scripted_patterns():
    from programs import scripted          # compiled now, as a program's imports are
    return scripted


def cuda_device_constants(graph) -> int:
    return str(graph).count('Device = prim::Constant[value="cuda')


def test_scripted_functions_classes_and_modules_run_on_the_target(shim):
    s = import_scripted_patterns()
    x = torch.randn(4, 8).cuda()
    gelu = x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))
    assert torch.allclose(s.bias_gelu(torch.zeros(8).cuda(), x), gelu)

    mask = s.padding_mask(torch.tensor([1, 3]).cuda(), 4)
    assert mask.tolist() == [[True, False, False, False], [True, True, True, False]]
    assert mask.device.type == "cpu" and cuda_device_constants(s.padding_mask.graph) == 0

    assert s.mean_of(torch.full((3,), 2.0)).item() == 2.0      # calls a scripted class

    eager = s.Block().cuda()
    block = torch.jit.script(eager)                  # torch.jit.script(module.cuda())
    assert torch.equal(block(x), eager(x)) and block(x).is_cuda
    assert cuda_device_constants(block.graph) == 0

    scripted_to = torch.jit.script(s.moved_to)
    assert scripted_to(torch.ones(2), torch.device("cuda")).device.type == "cpu"
    assert torch.jit.script(to_device)(torch.ones(2), torch.device("cpu")).device.type == "cpu"


def test_tracing_saving_and_loading_with_a_cuda_map_location(shim, tmp_path):
    s = import_scripted_patterns()
    x = torch.randn(2, 8).cuda()
    eager = s.Block().cuda()
    for kind, compiled in (("traced", torch.jit.trace(eager, x)), ("scripted", torch.jit.script(eager))):
        path = tmp_path / f"{kind}.pt"
        torch.jit.save(compiled, str(path))
        for map_location in ("cuda", torch.device("cuda", 0), None):
            loaded = torch.jit.load(str(path), map_location=map_location)
            assert torch.equal(loaded(x), eager(x)), (kind, map_location)


def test_modules_saved_naming_cuda_run_on_the_target_when_loaded(tmp_path):
    """A module scripted and saved where CUDA exists names CUDA devices in its code; loaded
    under the shim, it runs on the target."""
    import cudashim

    class Saved(torch.nn.Module):
        def forward(self, x: torch.Tensor):
            return x.to(torch.device("cuda")) + torch.ones(1, device="cuda:0")

    path = str(tmp_path / "saved.pt")
    torch.jit.save(torch.jit.script(Saved()), path)          # compiled natively: names CUDA
    with pytest.raises(RuntimeError):
        torch.jit.load(path)(torch.zeros(2))                 # no CUDA here
    cudashim.activate("cpu")
    loaded = torch.jit.load(path, map_location="cuda")
    assert loaded(torch.zeros(2)).tolist() == [1.0, 1.0]
    cudashim.deactivate()


def test_distributed_optim_and_its_functional_optimizers(shim, tmp_path):
    import torch.distributed as dist
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.distributed.optim.utils import functional_optim_map

    class Stepper(torch.nn.Module):
        """What DistributedOptimizer's scripted local optimizer does: step a functional
        optimizer held as a TorchScript class."""

        def __init__(self, optim):
            super().__init__()
            self.optim = optim

        def forward(self, gradients: List[Optional[torch.Tensor]]):
            self.optim.step(gradients)

    for optim_cls, functional_cls in functional_optim_map.items():
        start = torch.randn(3, 4).cuda()
        scripted_param, eager_param = start.clone(), torch.nn.Parameter(start.clone())
        stepper = torch.jit.script(Stepper(functional_cls([scripted_param], lr=0.1)))
        eager = optim_cls([eager_param], lr=0.1)
        gradient = torch.randn(3, 4).cuda()
        for _ in range(2):
            stepper([gradient])
            eager_param.grad = gradient.clone()
            eager.step()
        assert torch.allclose(scripted_param, eager_param.detach(), atol=1e-6), optim_cls.__name__

    dist.init_process_group("nccl", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    model = torch.nn.Linear(4, 2).cuda()
    zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.1)
    before = model.weight.detach().clone()
    model(torch.ones(3, 4).cuda()).sum().backward()
    zero.step()
    assert not torch.equal(model.weight, before)
    dist.destroy_process_group()


def test_torchscript_knows_every_replacement_as_its_builtin_and_forgets_it_after():
    import torch.distributed.optim  # noqa: F401  (its builtins are registered before the snapshot)
    import torch.jit._builtins as builtins

    import cudashim
    from cudashim.activation import current_activation

    table = builtins._get_builtin_table()
    before = dict(table)
    hooks_before = torch._C._jit_get_emit_hooks()
    cudashim.activate("cpu")
    replacements = [patch for patch in current_activation().registry
                    if patch.undo is None and not patch.is_item and id(patch.original) in before]
    assert {p.describe() for p in replacements} >= {"torch.zeros", "torch.device", "torch.arange"}
    for patch in replacements:
        assert builtins._find_builtin(patch.replacement) == before[id(patch.original)], patch.describe()
    replacement_ids = [id(p.replacement) for p in replacements]
    cudashim.deactivate()
    assert {key: table.get(key) for key in before} == before
    # torch registers an op as a TorchScript builtin at its first lookup through torch.ops (the
    # oneDNN ops the precision policy's packed linear looks up): torch's own entries, which any
    # program's lookup would leave, and no replacement among them
    added = {key: name for key, name in table.items() if key not in before}
    assert all("::" in name for name in added.values()), added
    assert not any(key in table for key in replacement_ids)
    assert torch._C._jit_get_emit_hooks() == hooks_before
    assert torch.jit.script(to_device)(torch.ones(1), torch.device("cpu")).device.type == "cpu"


def test_under_the_launcher_scripted_imports_and_a_cuda_default_type_run_on_the_target():
    from conftest import python

    code = (
        "import sys, warnings\n"
        "warnings.simplefilter('ignore')\n"
        "sys.path.insert(0, 'tests')\n"
        "import torch\n"
        "from torch.distributed.optim import ZeroRedundancyOptimizer\n"
        "from programs import scripted\n"
        "torch.set_default_tensor_type(torch.cuda.HalfTensor)\n"
        "block = torch.jit.script(scripted.Block().cuda())\n"
        "out = block(torch.ones(2, 8).cuda())\n"
        "print(out.dtype, out.is_cuda, out.device.type)\n")
    result = python("-m", "cudashim", "-c", code)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == ["torch.float16", "True", "cpu"]
