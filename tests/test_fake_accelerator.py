"""End to end on a fake accelerator that PyTorch itself believes is a device.

The unmodified CUDA examples run under cudashim with the backend resolved to the fake
device (``npu`` through a fake torch_npu, ``hpu`` through a fake Habana stack, and ``musa``,
a vendor cudashim has no code for, loaded by torch's own extension autoload). Their losses
equal those of the same programs hand-ported to that device.
"""

import json

import pytest
import torch

from conftest import fake_vendor_path, python, torchrun_two_nodes, use_fake_vendor

PROBE = """
import torch
x = torch.zeros(2, device="cuda")
m = torch.nn.Linear(2, 2).cuda()
print(x.device.type, x.is_cuda, next(m.parameters()).device.type, torch.cuda.is_available(),
      torch.cuda.get_device_name(0), torch.accelerator.current_accelerator().type)
"""

VENDORS = {"npu": "torch_npu", "hpu": "habana_frameworks.torch", "musa": None}


@pytest.mark.parametrize("vendor, backend", [("npu", "npu"), ("hpu", "hpu"), ("musa", "accelerator")])
def test_cuda_tensors_live_on_the_fake_device(vendor, backend):
    result = python("-m", "cudashim", "--report", "-c", PROBE, env={"PYTHONPATH": fake_vendor_path(vendor)})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[:4] == [vendor, "True", vendor, "True"]
    assert f"Fake {vendor.upper()}" in result.stdout
    assert f"cudashim report ({backend} backend)" in result.stderr


# Each example on one kind of vendor: a backend of its own (npu), and a device known only
# through torch.accelerator (musa), as the test accelerator and torchvulkan are known too.
@pytest.mark.parametrize("vendor, example, port, args", [
    ("npu", "examples/gpt.py", "tests/ported/gpt_ported.py", ["--steps", "12"]),
    ("musa", "examples/cnn.py", "tests/ported/cnn_ported.py", ["--epochs", "1"]),
])
def test_examples_on_the_fake_device_equal_the_hand_port(tmp_path, vendor, example, port, args):
    env = {"PYTHONPATH": fake_vendor_path(vendor)}
    extra = ["--checkpoint", str(tmp_path / "ckpt.pt")] if "gpt" in example else []
    shimmed = python("-m", "cudashim", example, *args, *extra, "--losses", str(tmp_path / "a.json"), env=env)
    assert shimmed.returncode == 0, shimmed.stderr[-3000:]
    vendor_import = ["--vendor", VENDORS[vendor]] if VENDORS[vendor] else []
    ported = python(port, "--device", vendor, *vendor_import, *args, *extra,
                    "--losses", str(tmp_path / "b.json"), env=env)
    assert ported.returncode == 0, ported.stderr[-3000:]
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert len(a) >= 10 and a == b                      # floats compared exactly
    assert a[-1] < a[0]
    if "gpt" in example:
        assert "training on Fake" in shimmed.stdout


def test_two_nodes_train_with_the_fake_collective(tmp_path, one_rank_ddp):
    """Two torchrun nodes with one fake NPU each: NCCL becomes hccl, DDP's gradients travel
    over it, and the result equals one process training on the same data."""
    nodes = torchrun_two_nodes("tests/programs/ddp_train.py", "--batch-size", "8",
                               "--out", str(tmp_path / "nodes.pt"),
                               env={"PYTHONPATH": fake_vendor_path("npu"),
                                    "CUDASHIM_REPORT_JSON": str(tmp_path / "r.json")})
    assert [code for code, _ in nodes] == [0, 0], nodes[0][1][-2000:] + nodes[1][1][-2000:]
    for rank in (0, 1):
        report = json.loads((tmp_path / f"r.rank{rank}.json").read_text())
        assert report["backend"] == "npu"
        assert report["apis"]["init_process_group"]["became"] == "cpu:gloo,npu:hccl"
        assert report["apis"]["DistributedDataParallel(device_ids)"]["became"] == "npu:0"
    b = one_rank_ddp
    use_fake_vendor("npu")
    import torch_npu  # noqa: F401  (the checkpoint holds npu tensors)
    a = torch.load(tmp_path / "nodes.pt")
    for key in b:
        assert a[key].device.type == "npu"
        torch.testing.assert_close(a[key].cpu(), b[key], rtol=1e-5, atol=1e-6)


def test_autocast_and_grad_scaler_written_for_cuda_run_on_the_fake_device():
    import cudashim
    use_fake_vendor("npu")
    cudashim.activate()
    assert cudashim.current_backend().name == "npu"
    model = torch.nn.Linear(4, 4).cuda()
    scaler = torch.cuda.amp.GradScaler()
    with torch.autocast("cuda", dtype=torch.float16):
        loss = model(torch.randn(8, 4).cuda()).pow(2).mean()
    scaler.scale(loss).backward()
    scaler.step(torch.optim.SGD(model.parameters(), lr=0.1))
    scaler.update()
    assert model.weight.grad.device.type == "npu" and scaler.get_scale() > 0
    assert torch.cuda.max_memory_allocated() > 0


def test_kernels_take_torch_npus_sign_packing_on_the_fake_npu():
    from cudashim import kernels
    from cudashim.kernels import bits
    use_fake_vendor("npu")
    import torch_npu  # noqa: F401
    x = torch.randn(1000).to("npu")
    packed = kernels.pack_signs(x)
    assert packed.device.type == "npu"
    assert torch.equal(packed.cpu(), bits.pack_signs(x.cpu()))
    assert torch.equal(kernels.unpack_signs(packed, 1000).cpu(), bits.unpack_signs(packed.cpu(), 1000))
    assert kernels.kernel_info()["pack_signs"]["npu"] == "torch_npu.npu_sign_bits_pack: ok"


ASK_COLLECTIVE = """
import subprocess, sys
import cudashim, torch
print(cudashim.current_backend().process_group_backend())
child = "import cudashim, torch; print(cudashim.current_backend().process_group_backend())"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
"""


def test_the_collective_option_reaches_the_program_and_its_children():
    env = {"PYTHONPATH": fake_vendor_path("npu")}
    default = python("-m", "cudashim", "-c", ASK_COLLECTIVE, env=env)
    chosen = python("-m", "cudashim", "--collective", "gloo", "-c", ASK_COLLECTIVE, env=env)
    assert default.returncode == 0 and chosen.returncode == 0, default.stderr + chosen.stderr
    assert default.stdout.split() == ["cpu:gloo,npu:hccl"] * 2
    assert chosen.stdout.split() == ["cpu:gloo,npu:gloo"] * 2
