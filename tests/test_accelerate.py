"""Hugging Face Accelerate scripts written for GPUs, launched unmodified under cudashim.

``tests/programs/accelerate_train.py`` is an Accelerate script as its documentation writes
one, run with ``accelerate launch``; ``notebook_launcher`` forks its ranks from a function.
"""

import json

import pytest

from conftest import ROOT, free_port, python, torchrun

pytest.importorskip("accelerate")

PROGRAM = str(ROOT / "tests" / "programs" / "accelerate_train.py")
LAUNCH = ("-m", "cudashim", "-m", "accelerate.commands.launch", "--num_machines", "1", "--dynamo_backend", "no")
TWO_DEVICES = {"CUDASHIM_DEVICE_COUNT": "2"}


def _launch(tmp_path, *options):
    out = tmp_path / "out.json"
    # a port of its own: accelerate's default (torch's 29500) is every other launcher's too
    result = python(*LAUNCH, "--main_process_port", str(free_port()), *options, PROGRAM, "--checkpoint", str(tmp_path / "checkpoints"), "--out", str(out),
                    env=TWO_DEVICES)
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(out.read_text())
    # on the target, answering is_cuda; resumed from save_state, the same steps repeat exactly
    assert seen["parameter"] == ["cpu", True]
    assert all(loss == loss and loss < 10 for loss in seen["losses"])
    assert seen["resumed"] == seen["continued"] and len(seen["continued"]) > 0
    assert seen["evaluated"] == 30                    # gather_for_metrics drops the padding
    return seen


def test_one_process_fp16_is_cudas_amp(tmp_path):
    """Accelerate keeps the CUDA device it chose, so fp16 is CUDA's AMP (GradScaler and
    autocast, as the precision policy runs them), not the silent float32 of its CPU path."""
    seen = _launch(tmp_path, "--num_processes", "1", "--mixed_precision", "fp16")
    assert seen["distributed_type"] == "DistributedType.NO" and seen["device"] == "cuda"
    assert seen["native_amp"] and seen["scaler"] == "GradScaler"


def test_multi_gpu_on_two_processes(tmp_path):
    seen = _launch(tmp_path, "--multi_gpu", "--num_processes", "2", "--mixed_precision", "bf16")
    assert seen["distributed_type"] == "DistributedType.MULTI_GPU" and seen["num_processes"] == 2
    assert seen["device"] == "cuda:0" and seen["backend"] == "nccl" and seen["native_amp"]


NOTEBOOK = '''
import torch
from accelerate import Accelerator, notebook_launcher

def training_function():
    accelerator = Accelerator(mixed_precision="fp16")
    model = torch.nn.Linear(4, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.ones(8, 4, device=accelerator.device)).pow(2).mean())
    optimizer.step()
    ranks = accelerator.reduce(torch.ones(1, device=accelerator.device), reduction="sum")
    print(f"rank {accelerator.process_index}: {accelerator.distributed_type} {accelerator.device} "
          f"{ranks.item()} {accelerator.native_amp}")

notebook_launcher(training_function, num_processes=2, use_port="{port}")
'''


def test_notebook_launcher_forks_two_ranks(tmp_path):
    program = tmp_path / "notebook.py"
    program.write_text(NOTEBOOK.replace("{port}", str(free_port())))     # not the default 29500: see _launch
    result = python("-m", "cudashim", str(program), env=TWO_DEVICES)
    assert result.returncode == 0, result.stderr[-4000:]
    for rank in (0, 1):
        assert f"rank {rank}: DistributedType.MULTI_GPU cuda:{rank} 2.0 True" in result.stdout


def test_accelerate_env_reports_cuda():
    result = python("-m", "cudashim", "-m", "accelerate.commands.accelerate_cli", "env")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "- PyTorch accelerator: CUDA" in result.stdout


def test_the_state_gets_its_own_set_device_back():
    import cudashim
    from accelerate.state import PartialState
    original = vars(PartialState)["set_device"]
    cudashim.activate("cpu")
    try:
        assert vars(PartialState)["set_device"] is not original
    finally:
        cudashim.deactivate()
    assert vars(PartialState)["set_device"] is original


TRAINER = str(ROOT / "tests" / "programs" / "hf_trainer.py")


def test_the_hugging_face_trainer_on_two_ranks_resumes_exactly(tmp_path):
    """transformers' Trainer decides its device through Accelerate's state: under torchrun
    each rank trains a DDP-wrapped model on its CUDA device in CUDA's fp16 AMP, and training
    resumed from a checkpoint repeats the uninterrupted run's losses."""
    out = tmp_path / "out.json"
    result = torchrun(TRAINER, "--output-dir", str(tmp_path / "run"), "--out", str(out), env=TWO_DEVICES)
    assert result.returncode == 0, result.stderr[-4000:]
    seen = json.loads(out.read_text())
    assert seen["device"] == "cuda:0" and seen["n_gpu"] == 1 and seen["world_size"] == 2
    assert seen["parallel_mode"] == "ParallelMode.DISTRIBUTED" and seen["backend"] == "nccl"
    assert seen["wrapped"] == "DistributedDataParallel" and seen["scaler"] == "GradScaler"
    assert seen["parameter"] == ["cpu", True]
    losses, resumed = seen["losses"], seen["resumed"]
    assert sorted(losses) == [str(step) for step in range(1, 7)] and all(loss < 10 for loss in losses.values())
    # the resumed run logs steps 4 to 6 after the history it loaded from checkpoint-3
    assert sorted(resumed) == sorted(losses) and all(resumed[step] == losses[step] for step in ("4", "5", "6"))
