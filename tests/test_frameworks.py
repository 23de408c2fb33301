"""The frameworks group: DeepSpeed is told which of its accelerators matches the target.

These need no DeepSpeed; tests/test_deepspeed.py runs real DeepSpeed programs."""

import os
import sys
import types
import warnings

import pytest
import torch  # noqa: F401  (activation patches once torch is imported)

import cudashim
from cudashim.backends import backend_class
from cudashim.errors import CudashimWarning


@pytest.mark.parametrize("name, expected", [("cpu", "cpu"), ("xpu", "xpu"), ("npu", "npu"),
                                            ("hpu", "hpu"), ("mps", "mps"), ("cuda", None)])
def test_each_backend_names_the_matching_deepspeed_accelerator(name, expected):
    assert backend_class(name).deepspeed_accelerator == expected


def test_activation_names_the_target_accelerator_and_deactivation_takes_it_back(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    cudashim.activate("cpu")
    assert os.environ["DS_ACCELERATOR"] == "cpu"
    cudashim.deactivate()
    assert "DS_ACCELERATOR" not in os.environ


def test_the_users_own_choice_is_kept(monkeypatch):
    monkeypatch.setenv("DS_ACCELERATOR", "cuda")
    with cudashim.activated("cpu"):
        assert os.environ["DS_ACCELERATOR"] == "cuda"
    assert os.environ["DS_ACCELERATOR"] == "cuda"


def test_with_the_group_off_deepspeed_is_not_told(monkeypatch):
    monkeypatch.delenv("DS_ACCELERATOR", raising=False)
    with cudashim.activated("cpu", disable=["frameworks"]):
        assert "DS_ACCELERATOR" not in os.environ


def _fake_deepspeed(monkeypatch, chosen_name):
    """DeepSpeed's two modules the group hooks, already imported (with a chosen accelerator)."""
    chosen = types.SimpleNamespace(_name=chosen_name)
    real_accelerator = types.ModuleType("deepspeed.accelerator.real_accelerator")
    real_accelerator.ds_accelerator = chosen
    cpu_accelerator = types.ModuleType("deepspeed.accelerator.cpu_accelerator")

    class CPU_Accelerator:
        def is_fp16_supported(self):
            return False

    cpu_accelerator.CPU_Accelerator = CPU_Accelerator
    monkeypatch.setitem(sys.modules, real_accelerator.__name__, real_accelerator)
    monkeypatch.setitem(sys.modules, cpu_accelerator.__name__, cpu_accelerator)
    return CPU_Accelerator


def test_deepspeed_that_chose_cuda_before_activation_is_warned_about(monkeypatch):
    _fake_deepspeed(monkeypatch, "cuda")
    with pytest.warns(CudashimWarning, match="DeepSpeed chose its 'cuda' accelerator before"):
        cudashim.activate("cpu")
    cudashim.deactivate()


def test_deepspeed_that_chose_the_matching_one_is_not_warned_about(monkeypatch):
    _fake_deepspeed(monkeypatch, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("error", CudashimWarning)
        cudashim.activate("cpu")
    cudashim.deactivate()


def test_the_cpu_accelerator_answers_fp16_while_active(monkeypatch):
    accelerator = _fake_deepspeed(monkeypatch, "cpu")
    with cudashim.activated("cpu"):
        assert accelerator().is_fp16_supported() is True
    assert accelerator().is_fp16_supported() is False
