"""The unmodified CUDA examples under python -m cudashim equal their hand ports, bit for bit."""

import json

import pytest

from conftest import python

pytestmark = pytest.mark.host          # the precision policy's choice (each case names its host profile) and torch's kernels


def _best_port_options(profile):
    """How a port written for the fast dtypes of a CPU of host profile ``profile`` trains: the
    dtype the precision policy picks for CUDA's float16 autocast, and what TF32 becomes."""
    import torch

    from cudashim.backends import cpu_speed
    from cudashim.precision import PrecisionPolicy

    policy = PrecisionPolicy("auto", "auto", "cpu", *cpu_speed.speeds(profile))
    chosen = policy.autocast_dtype(torch.float16)
    options = ["--amp-dtype", "float32" if chosen is None else str(chosen).replace("torch.", "")]
    if policy.float32_matmul_precision:
        options += ["--mkldnn-matmul-precision", policy.float32_matmul_precision]
    return options


@pytest.mark.parametrize("example, port, args, precision, profile", [
    # as asked: the translation alone, float16 autocast as written
    ("examples/gpt.py", "tests/ported/gpt_ported.py", ["--steps", "25"], "as-asked", "slow"),
    # by default: float16 and TF32 mean the target's fast dtypes, named by the host profile: on a
    # CPU that emulates both, float16 autocast runs in float32; where bfloat16 is fast, in
    # bfloat16, with TF32 as oneDNN's bfloat16 matmuls
    pytest.param("examples/gpt.py", "tests/ported/gpt_ported.py", ["--steps", "25"], "auto", "slow",
                 marks=pytest.mark.torch_range),
    ("examples/gpt.py", "tests/ported/gpt_ported.py", ["--steps", "25"], "auto", "bfloat16"),
    ("examples/cnn.py", "tests/ported/cnn_ported.py", ["--epochs", "2"], "auto", "slow"),
])
def test_shimmed_losses_equal_the_hand_port(tmp_path, example, port, args, precision, profile):
    extra = ["--checkpoint", str(tmp_path / "ckpt.pt")] if "gpt" in example else []
    shimmed = python("-m", "cudashim", "--amp-dtype", precision, "--host-profile", profile, example, *args,
                     *extra, "--losses", str(tmp_path / "a.json"))
    assert shimmed.returncode == 0, shimmed.stderr
    port_options = _best_port_options(profile) if "gpt" in example and precision == "auto" else []
    ported = python(port, *args, *extra, *port_options, "--losses", str(tmp_path / "b.json"))
    assert ported.returncode == 0, ported.stderr
    a, b = (json.loads((tmp_path / n).read_text()) for n in ("a.json", "b.json"))
    assert len(a) >= 20 and a == b                  # floats compared exactly
    assert a[-1] < a[0], "the example should learn"


def test_the_example_cannot_run_on_this_cpu_without_the_shim(tmp_path):
    plain = python("examples/gpt.py", "--steps", "1", "--checkpoint", str(tmp_path / "c.pt"))
    assert plain.returncode != 0 and "needs a CUDA GPU" in plain.stderr
