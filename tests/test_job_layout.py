"""How many ranks share a node, read from each launcher's environment: each rank's
``torch.cuda.set_device(local_rank)`` needs a CUDA index of its own."""

import pytest

from cudashim.job_layout import local_world_size, rank, slurm_tasks_on_node


@pytest.mark.parametrize("tasks_per_node, node, expected", [
    ("4", 0, 4), ("2(x3)", 2, 2), ("2(x3),1", 3, 1), ("3,1(x2)", 0, 3),
    ("2(x3)", 3, None), ("two", 0, None), ("", 0, None), ("2(x)", 0, None)])
def test_slurm_tasks_per_node_as_slurm_compresses_it(tasks_per_node, node, expected):
    assert slurm_tasks_on_node(tasks_per_node, node) == expected


@pytest.mark.parametrize("environ, expected", [
    ({}, None),
    ({"LOCAL_WORLD_SIZE": "4"}, 4),                                      # torchrun
    ({"LOCAL_SIZE": "2", "RANK": "3"}, 2),                               # DeepSpeed's launcher
    ({"OMPI_COMM_WORLD_LOCAL_SIZE": "8"}, 8),                            # mpirun
    ({"SLURM_PROCID": "3", "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "2(x2)"}, 2),
    ({"SLURM_PROCID": "4", "SLURM_NODEID": "1", "SLURM_TASKS_PER_NODE": "4,1"}, 1),
    ({"SLURM_PROCID": "0", "SLURM_NTASKS_PER_NODE": "3", "SLURM_TASKS_PER_NODE": "2"}, 3),
    ({"SLURM_TASKS_PER_NODE": "2(x2)"}, None),             # salloc's shell: no task of srun's
    ({"LOCAL_WORLD_SIZE": "0"}, None), ({"LOCAL_WORLD_SIZE": "x", "LOCAL_SIZE": "2"}, 2)])
def test_each_launchers_local_size(environ, expected):
    assert local_world_size(environ) == expected


@pytest.mark.parametrize("environ, expected", [
    ({}, None), ({"RANK": "3", "SLURM_PROCID": "0"}, "3"), ({"SLURM_PROCID": "5"}, "5"),
    ({"OMPI_COMM_WORLD_RANK": "2"}, "2"), ({"PMI_RANK": "7"}, "7"), ({"RANK": ""}, None)])
def test_each_launchers_rank(environ, expected):
    assert rank(environ) == expected


def test_the_cpu_backends_virtual_devices_follow_srun(monkeypatch):
    import torch
    import cudashim
    for name in ("CUDA_VISIBLE_DEVICES", "LOCAL_WORLD_SIZE", "CUDASHIM_DEVICE_COUNT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "3")
    monkeypatch.setenv("SLURM_NODEID", "1")
    monkeypatch.setenv("SLURM_TASKS_PER_NODE", "2(x2)")
    cudashim.activate("cpu")
    try:
        assert torch.cuda.device_count() == 2
        torch.cuda.set_device(1)
        assert torch.cuda.current_device() == 1
    finally:
        cudashim.deactivate()
