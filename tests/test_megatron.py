"""megatron-core training a tiny GPT written for CUDA, unmodified under ``python -m cudashim``.

megatron-core is not in the suite's environment; tox's ``frameworks`` environment installs it
and runs this file. The program (``tests/programs/megatron_gpt.py``) makes the calls
Megatron-LM's ``pretrain_gpt.py`` makes through ``megatron.training``, which is not on PyPI.
"""

import json
import math

import pytest

from conftest import ROOT, torchrun

pytest.importorskip("megatron.core")

PROGRAM = str(ROOT / "tests" / "programs" / "megatron_gpt.py")
SAVED_AT, STEPS, RESUMED = 5, 8, 3


def _two_ranks(out, *options):
    result = torchrun(PROGRAM, *options, "--out", str(out), timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("parallelism", [("--tp", "2"), ("--pp", "2")], ids=["tensor", "pipeline"])
def test_a_tiny_gpt_trains_in_fp16_saves_and_resumes_on_two_ranks(tmp_path, parallelism):
    checkpoint = tmp_path / "checkpoint"
    trained = _two_ranks(tmp_path / "trained", *parallelism, "--steps", str(STEPS),
                         "--save-at", str(SAVED_AT), "--save", str(checkpoint))
    resumed = _two_ranks(tmp_path / "resumed", *parallelism, "--steps", str(RESUMED),
                         "--load", str(checkpoint))

    split = "tp_rank" if parallelism[0] == "--tp" else "pp_rank"
    assert sorted(rank[split] for rank in trained) == [0, 1]          # the groups Megatron made
    for rank in trained:
        assert rank["backend"] == "nccl" and rank["parameter"] == ["cpu", "torch.float16", True]
        assert rank["optimizers"] == ["Float16OptimizerWithFloat16Params, DynamicGradScaler"]

    # The dynamic scaler: 2**20 overflows float16's gradients, the step is skipped on every
    # rank alike and the scale halves; later steps update.
    steps = trained[0]["steps"]
    assert all(rank["steps"][i]["updated"] == steps[i]["updated"] for rank in trained for i in range(STEPS))
    assert not steps[0]["updated"] and steps[1]["scale"] == steps[0]["scale"] / 2
    assert sum(step["updated"] for step in steps) >= STEPS // 2

    # The loss, on the last pipeline stage: finite, and lower after training.
    losses = [[step["loss"] for step in rank["steps"]] for rank in trained if rank["steps"][0]["loss"] is not None]
    assert losses and all(math.isfinite(loss) for loss in losses[0])
    assert sum(losses[0][-2:]) / 2 < losses[0][0]
    # Evaluated after every step, under torch.no_grad: an update changes the held-out loss.
    evaluated = [step["eval_loss"] for step in trained[-1]["steps"]]
    for before, after, step in zip(evaluated, evaluated[1:], trained[-1]["steps"][1:]):
        assert (after != before) == step["updated"]
    if split == "tp_rank":                                 # whole weights stay equal on both
        assert trained[0]["replicated"] == trained[1]["replicated"] and losses[0] == losses[1]

    # The distributed checkpoint resumes exactly: the same losses, scales and norms.
    for before, after in zip(trained, resumed):
        assert after["first_step"] == SAVED_AT
        assert after["steps"] == before["steps"][SAVED_AT:SAVED_AT + RESUMED]
