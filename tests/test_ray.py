"""A Ray Train script written for GPUs, run unmodified under ``python -m cudashim``.

Ray is not in the suite's environment; tox's ``frameworks`` environment installs a pinned
release and runs this file. The program is ``tests/programs/ray_train.py``: a ``TorchTrainer``
with ``ScalingConfig(num_workers=2, use_gpu=True)`` on a local cluster.
"""

import json

import pytest

from conftest import ROOT, python

pytest.importorskip("ray.train.torch")

PROGRAM = str(ROOT / "tests" / "programs" / "ray_train.py")


def test_use_gpu_schedules_two_workers_that_train_ddp_on_cuda_devices(tmp_path):
    """Ray's head node counts the CUDA devices the program sees (its own NVML copy finds
    none here, and the workers would wait for GPUs forever); each worker it starts is under
    cudashim, trains its DDP model over the program's NCCL on its CUDA device, and rank 0's
    checkpoint loads in plain torch."""
    import torch

    out = tmp_path / "out"
    out.mkdir()
    result = python("-m", "cudashim", PROGRAM, "--storage", str(tmp_path / "storage"), "--out", str(out),
                    env={"CUDASHIM_DEVICE_COUNT": "2"}, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    driver = json.loads((out / "driver.json").read_text())
    assert driver["cluster_gpus"] == 2
    ranks = [json.loads((out / f"rank{rank}.json").read_text()) for rank in (0, 1)]
    for rank in ranks:
        assert rank["world_size"] == 2 and rank["backend"] == "nccl" and rank["wrapped"] == "DistributedDataParallel"
        assert rank["device_is_cuda"] and rank["parameter"] == ["cpu", True]
        assert len(rank["losses"]) == 8 and all(loss == loss and loss < 10 for loss in rank["losses"])
    # each rank trained on its own shard of the data, and DDP kept their weights the same
    assert ranks[0]["losses"] != ranks[1]["losses"] and ranks[0]["weights"] == ranks[1]["weights"]
    state = torch.load(f"{driver['checkpoint']}/model.pt")
    assert sum(value.double().sum().item() for value in state.values()) == pytest.approx(ranks[0]["weights"])


def test_rays_gpu_count_is_the_programs_while_active_and_its_own_after():
    import cudashim
    from ray._private.accelerators.nvidia_gpu import NvidiaGPUAcceleratorManager as Manager
    original = vars(Manager)["get_current_node_num_accelerators"]
    cudashim.activate("cpu", device_count=2)
    try:
        assert Manager.get_current_node_num_accelerators() == 2
    finally:
        cudashim.deactivate()
    assert vars(Manager)["get_current_node_num_accelerators"] is original
