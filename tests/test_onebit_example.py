"""examples/onebit_adam.py on 2 torchrun ranks converges close to plain Adam."""

import json

from conftest import ROOT, python


def _train(tmp_path, optimizer):
    out = tmp_path / f"{optimizer}.json"
    result = python("-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                    "examples/onebit_adam.py", "--optimizer", optimizer, "--steps", "200",
                    "--losses", str(out), env={"PYTHONPATH": str(ROOT)}, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(out.read_text())


def test_onebit_adam_converges_close_to_adam(tmp_path):
    adam, onebit = _train(tmp_path, "adam"), _train(tmp_path, "onebit")
    assert adam[-1] < adam[0] / 5 and onebit[-1] < onebit[0] / 5      # both learn
    assert onebit[-1] <= max(2 * adam[-1], adam[-1] + 0.02)            # and end close
