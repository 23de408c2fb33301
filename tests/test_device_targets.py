"""torchvulkan: a real PrivateUse1 accelerator nobody here wrote, as a cudashim target.

torchvulkan (PyPI) runs on Mesa's software Vulkan driver ("llvmpipe"). Its tensors live in
device memory (``.numpy()`` is refused, ``.cpu()`` copies), so a copy cudashim forgot, a
wrong device or a host-only path fails here where the CPU backend hides it. It has no
collective library, streams or events of its own: cudashim supplies them. The programs run
under ``python -m cudashim --device-extension torchvulkan`` and are compared with the same
programs on the CPU backend.
"""

import json
import subprocess
import sys

import pytest

from conftest import free_port, python, torchrun

VULKAN = ("--device-extension", "torchvulkan")


def _why_vulkan_cannot_run():
    """None where torchvulkan computes here. Asked in a fresh interpreter: importing it in the
    test process would rename torch's PrivateUse1 device for every test that follows."""
    probe = "import torch, torchvulkan; print(torch.ones(2, device='vulkan').sum().item())"
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300)
    if result.returncode == 0 and result.stdout.strip() == "2.0":
        return None
    last = (result.stderr.strip().splitlines() or ["no output"])[-1]
    return (f"torchvulkan cannot run here ({last}): pip install torchvulkan==0.2.1, and the Vulkan "
            "loader and Mesa's driver (apt install libvulkan1 mesa-vulkan-drivers)")


WHY_NOT = _why_vulkan_cannot_run()
pytestmark = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


def _run(*args, vulkan=True, timeout=600):
    result = python("-m", "cudashim", *(VULKAN if vulkan else ()), *args, timeout=timeout)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_a_cuda_program_sees_cuda_on_vulkan_with_memory_of_its_own(tmp_path):
    seen = {}
    for target, vulkan in (("vulkan", True), ("cpu", False)):
        _run("tests/programs/device_semantics.py", str(tmp_path / f"{target}.json"),
             str(tmp_path / f"{target}.pt"), vulkan=vulkan)
        seen[target] = json.loads((tmp_path / f"{target}.json").read_text())
    vulkan, cpu = seen["vulkan"], seen["cpu"]
    assert vulkan["host_readable"] is False and cpu["host_readable"] is True
    assert vulkan["device_index"] == 0 and vulkan["device_count"] == 1 and vulkan["memory_allocated"] > 0
    assert vulkan["loader_sum"] == cpu["loader_sum"] == 120
    # float16 autocast on vulkan, the CPU's fast dtype on the host: the same first loss, nearly
    assert vulkan["amp_losses"][0] == pytest.approx(cpu["amp_losses"][0], rel=1e-3)
    assert all(loss == loss for loss in vulkan["amp_losses"]) and vulkan["amp_losses"][-1] < vulkan["amp_losses"][0]

    doctor = python("-c", "from cudashim.cli import main; main()", "doctor", *VULKAN)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "chosen backend: accelerator 'vulkan'" in doctor.stdout
    assert "NCCL becomes 'staged' (through host memory to gloo" in doctor.stdout


def test_the_gpt_example_trains_checkpoints_and_resumes_on_vulkan_as_on_the_cpu(tmp_path):
    """Events time its steps; the checkpoint is saved on the device and restored."""
    losses = {}
    for target, vulkan in (("vulkan", True), ("cpu", False)):
        run = _run("examples/gpt.py", "--steps", "6", "--checkpoint", str(tmp_path / target / "ckpt.pt"),
                   "--losses", str(tmp_path / f"{target}.json"), vulkan=vulkan)
        assert "6 steps in" in run.stdout and "restored" in run.stdout      # timed with events
        losses[target] = json.loads((tmp_path / f"{target}.json").read_text())
    assert losses["vulkan"] == pytest.approx(losses["cpu"], rel=5e-3)
    assert losses["vulkan"][-1] < losses["vulkan"][0]


def test_ddp_on_two_ranks_sharing_one_vulkan_device_trains_as_on_the_cpu(tmp_path):
    """NCCL becomes collectives staged through host memory; each rank's set_device(local_rank)
    lands on the one device."""
    import torch
    for target, options in (("vulkan", VULKAN), ("cpu", ())):
        result = torchrun("tests/programs/ddp_train.py", "--epochs", "1", "--out", str(tmp_path / f"{target}.pt"),
                          shim_options=options, timeout=600)
        assert result.returncode == 0, result.stderr[-4000:]
    on_vulkan = torch.load(tmp_path / "vulkan.pt", map_location="cpu")      # tagged vulkan:0
    on_cpu = torch.load(tmp_path / "cpu.pt")
    assert on_vulkan.keys() == on_cpu.keys()
    for key in on_cpu:
        torch.testing.assert_close(on_vulkan[key], on_cpu[key], rtol=1e-5, atol=1e-6)


def test_the_hugging_face_trainer_trains_and_resumes_on_vulkan(tmp_path):
    """transformers' Trainer under torchrun, two ranks on the device, CUDA's fp16 AMP: the run
    resumed from its checkpoint repeats the uninterrupted run's losses."""
    pytest.importorskip("transformers")
    out = tmp_path / "out.json"
    result = torchrun("tests/programs/hf_trainer.py", "--output-dir", str(tmp_path / "run"), "--out", str(out),
                      "--ddp-find-unused-parameters", "false", shim_options=VULKAN, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(out.read_text())
    assert seen["parameter"] == ["vulkan:0", True] and seen["wrapped"] == "DistributedDataParallel"
    assert seen["device"] == "cuda:0" and seen["scaler"] == "GradScaler"
    assert all(seen["resumed"][step] == seen["losses"][step] for step in ("4", "5", "6"))


UNUSED_PARAMETERS = """
import os, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
dist.init_process_group("nccl", rank=0, world_size=1)
model = torch.nn.Linear(4, 1).cuda()
for find_unused in (True, False):
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[0], find_unused_parameters=find_unused)
        ddp(torch.ones(2, 4, device="cuda")).sum().backward()
        print("trained", model.weight.grad.sum().item())
    except RuntimeError as error:
        print(type(error).__name__, error)
dist.destroy_process_group()
"""


def test_ddp_tracking_unused_parameters_is_refused_where_the_device_pins_no_memory():
    """torch's DDP reducer stages its record of used parameters in pinned host memory for a
    PrivateUse1 device and asserts it got some; torchvulkan pins nothing. The program hears
    why when it wraps the model (not torch's internal assert in backward), and the way out runs."""
    result = python("-m", "cudashim", *VULKAN, "-c", UNUSED_PARAMETERS, env={"PORT": str(free_port())})
    assert result.returncode == 0, result.stderr[-4000:]
    refused, trained = result.stdout.strip().splitlines()[-2:]
    assert refused.startswith("UnsupportedCudaAPI DistributedDataParallel(find_unused_parameters=True) is not "
                              "supported by cudashim on the 'vulkan' backend: torch's DDP stages")
    assert "find_unused_parameters=False runs" in refused
    assert trained == "trained 8.0"


def test_eager_init_with_a_cuda_device_id_and_a_mesh_from_the_group_on_vulkan():
    """init_process_group("nccl", device_id=cuda_device) and DeviceMesh.from_group on the
    collectives cudashim stages through host memory: its group connects no device eagerly,
    and it has the name and per-device backends torch reads from a group."""
    result = torchrun("tests/programs/eager_init.py", nproc=1, shim_options=VULKAN, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0: bound nccl, torchvulkan, True, torch.float16" in result.stdout


def test_spawned_ranks_share_the_vulkan_device_when_asked_for_two(tmp_path):
    _run("--device-count", "2", "tests/programs/spawned_ranks.py", str(tmp_path / "spawned"))
    ranks = [json.loads((tmp_path / f"spawned.rank{rank}.json").read_text()) for rank in (0, 1)]
    assert [rank["current"] for rank in ranks] == [0, 1]
    for rank in ranks:
        assert rank == {**rank, "sum": [3.0, 3.0, 3.0], "is_cuda": True, "backend": "nccl"}


def test_transformers_generates_the_same_tokens_on_vulkan_as_on_the_cpu(tmp_path):
    pytest.importorskip("transformers")
    tokens = {}
    for target, vulkan in (("vulkan", True), ("cpu", False)):
        run = _run("tests/programs/hf_generate.py", str(tmp_path / target), vulkan=vulkan)
        tokens[target] = json.loads(run.stdout.strip().splitlines()[-1])
    assert tokens["vulkan"] == tokens["cpu"]
    assert tokens["vulkan"]["sdpa"] == tokens["vulkan"]["flash_attention_2"]


def test_the_cuda_libraries_example_trains_on_vulkan_with_the_stand_ins(tmp_path):
    """flash_attn, apex and pynvml stand-ins on device tensors. The example draws its batches
    on the device, whose generator is not the host's, so its losses are compared in shape."""
    run = _run("--report", "examples/cuda_libraries.py", "--steps", "20", "--losses", str(tmp_path / "a.json"))
    losses = json.loads((tmp_path / "a.json").read_text())
    assert len(losses) == 20 and losses[-1] < losses[0] / 2
    assert "GPU memory used" in run.stdout
    for library in ("flash_attn", "apex"):
        assert f"{library}: the real package is not installed" in run.stderr
    # torch imported the installed nvidia-ml-py before cudashim activated: replaced then
    assert "pynvml: the real package, imported before activation, it fails on vulkan" in run.stderr


def test_qlora_trains_and_generates_on_vulkan_as_on_the_cpu(tmp_path):
    """transformers loads the model quantized by bitsandbytes onto the device (through torch's
    private _parse_to), PEFT trains LoRA adapters there and it generates: the same losses and
    tokens as on the CPU backend. bitsandbytes says once that its 8-bit optimizers have no
    kernel on vulkan; the program uses none. 8-bit here; 4-bit (nf4) runs the same way, on
    bitsandbytes' kernels in torch operations, at several times the cost on llvmpipe."""
    for package in ("bitsandbytes", "peft", "transformers"):
        pytest.importorskip(package)
    results = {}
    for target, vulkan in (("vulkan", True), ("cpu", False)):
        run = _run("tests/programs/qlora.py", str(tmp_path / target), "--bits", "8", "--steps", "3",
                   "--new-tokens", "3", vulkan=vulkan)
        results[target] = json.loads(run.stdout.strip().splitlines()[-1])
        said = [line for line in run.stderr.splitlines() if "has no kernel on" in line]
        assert len(said) == (1 if vulkan else 0) and (not said or "8-bit optimizers" in said[0])
    assert results["vulkan"]["device"] == "vulkan:0" and results["vulkan"]["adapters_moved"]
    assert results["vulkan"]["weight_dtype"] == results["cpu"]["weight_dtype"]
    assert results["vulkan"]["losses"] == pytest.approx(results["cpu"]["losses"], rel=1e-4)
    assert results["vulkan"]["tokens"] == results["cpu"]["tokens"]


def test_recurrent_models_train_on_vulkan_as_on_the_cpu(tmp_path):
    """nn.LSTM, nn.GRU and their cells call fused cell ops that only CUDA implements on
    every accelerator; the host has no kernel for them either, so torchvulkan's own host
    fallback cannot run them. cudashim's portable kernels compute them on the device."""
    losses = {}
    for target, vulkan in (("vulkan", True), ("cpu", False)):
        run = _run("--report", "tests/programs/recurrent.py", str(tmp_path / f"{target}.json"), vulkan=vulkan)
        losses[target] = json.loads((tmp_path / f"{target}.json").read_text())
        filled = [line for line in run.stderr.splitlines() if "cudashim's portable kernel" in line]
        assert len(filled) == (4 if vulkan else 0), run.stderr[-3000:]
    assert losses["vulkan"].keys() == {"LSTM", "GRU", "LSTMCell", "GRUCell"}
    for model, on_cpu in losses["cpu"].items():
        assert losses["vulkan"][model] == pytest.approx(on_cpu, rel=1e-5)
        assert losses["vulkan"][model][-1] < losses["vulkan"][model][0]

    doctor = python("-c", "from cudashim.cli import main; main()", "doctor", "--kernels", *VULKAN)
    assert doctor.returncode == 0, doctor.stdout + doctor.stderr
    assert "aten::_thnn_fused_lstm_cell, aten::_thnn_fused_lstm_cell_backward_impl" in doctor.stdout
    assert "extension's own fallback runs them on the host" in doctor.stdout


def test_sync_batch_norm_on_two_ranks_normalizes_with_the_whole_batch_on_vulkan(tmp_path):
    """SyncBatchNorm's statistics ops are CUDA-only (cudashim's portable kernels on the
    device), and it gathers them into a (1, world * n) tensor as NCCL allows (the staged
    library hands gloo the concatenation): each rank's share normalizes, back-propagates
    and updates running statistics as plain BatchNorm over the whole batch does (the same
    program on the CPU backend: tests/test_multiprocess.py)."""
    result = torchrun("tests/programs/sync_batchnorm.py", str(tmp_path / "sbn"), shim_options=VULKAN, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"sbn.rank{rank}.json").read_text())
        assert seen["device"] == "vulkan:0"
        assert all(worst < 1e-5 for worst in seen["worst"].values()), seen


def test_data_parallel_and_model_parallel_on_two_cuda_devices_sharing_vulkan(tmp_path):
    """nn.DataParallel, data_parallel, nn.parallel by hand and torch.cuda.comm over cuda:0 and
    cuda:1, both on the one vulkan device: replicas get copies in device memory, host inputs
    are scattered onto the device, gathers to "cpu" reach the host (the checks:
    test_data_parallel.py). The tutorials' model-parallel halves and a DCGAN with --ngpu 2
    train as on the CPU backend."""
    from test_data_parallel import TWO, check_semantics, semantics
    seen = {}
    for target, options in (("vulkan", VULKAN + TWO), ("cpu", TWO)):
        (tmp_path / target).mkdir()
        seen[target] = semantics(tmp_path / target, options)
    check_semantics(seen["vulkan"])
    assert seen["vulkan"]["reduce_add_host_input"] == "AssertionError"   # as CUDA: inputs on GPUs
    assert seen["vulkan"]["loss"] == pytest.approx(seen["cpu"]["loss"], rel=1e-5)

    _run(*TWO, "tests/programs/model_parallel_tutorial.py", str(tmp_path / "mp.json"))
    parallel = json.loads((tmp_path / "mp.json").read_text())
    assert parallel["parts_on"] == ["vulkan:0", "vulkan:0"] and parallel["toy_output_on"] == "vulkan:0"
    assert parallel["pipeline"] == pytest.approx(parallel["single"], rel=1e-5)
    assert parallel["model_parallel"] == pytest.approx(parallel["single"], rel=1e-5)

    losses = {}
    for target, vulkan in (("vulkan", True), ("cpu", False)):
        _run(*TWO, "tests/programs/dcgan_data_parallel.py", str(tmp_path / f"dcgan-{target}.json"),
             "--ngpu", "2", vulkan=vulkan)
        steps = json.loads((tmp_path / f"dcgan-{target}.json").read_text())["losses"]
        losses[target] = [loss for step in steps for loss in step]      # (D, G) per step
    assert losses["vulkan"] == pytest.approx(losses["cpu"], rel=1e-4)
