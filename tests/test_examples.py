"""The unmodified CUDA examples under python -m cudashim equal their hand ports, bit for bit."""

import json

import pytest

from conftest import python


@pytest.mark.parametrize("example, port, args", [
    ("examples/gpt.py", "tests/ported/gpt_ported.py", ["--steps", "25"]),
    ("examples/cnn.py", "tests/ported/cnn_ported.py", ["--epochs", "2"]),
])
def test_shimmed_losses_equal_the_hand_port(tmp_path, example, port, args):
    extra = ["--checkpoint", str(tmp_path / "ckpt.pt")] if "gpt" in example else []
    shimmed = python("-m", "cudashim", example, *args, *extra, "--losses", str(tmp_path / "a.json"))
    assert shimmed.returncode == 0, shimmed.stderr
    ported = python(port, *args, *extra, "--losses", str(tmp_path / "b.json"))
    assert ported.returncode == 0, ported.stderr
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert len(a) >= 20 and a == b                  # floats compared exactly
    assert a[-1] < a[0], "the example should learn"


def test_the_example_cannot_run_on_this_cpu_without_the_shim(tmp_path):
    plain = python("examples/gpt.py", "--steps", "1", "--checkpoint", str(tmp_path / "c.pt"))
    assert plain.returncode != 0 and "needs a CUDA GPU" in plain.stderr
