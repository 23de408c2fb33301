"""What the program's author reads: cudashim's warnings name the program's own line, and an
uncaught refusal's traceback ends there, by every route (launcher, cudashim.auto, the image
hook), while the exception itself keeps every frame for the program's own handlers."""

import pytest

from conftest import ROOT, python

HOOK_ENV = {"CUDASHIM_ACTIVATE": "1", "PYTHONPATH": f"{ROOT / 'sitecustomize'}:{ROOT}"}

REFUSING = """\
import torch

def capture():
    return torch.cuda.MemPool()

capture()
"""


def _run(route, program, tmp_path, extra_env=None):
    script = tmp_path / "program.py"
    script.write_text(("import cudashim.auto\n" if route == "auto" else "") + program)
    # The checkout's cudashim, which a program started outside it would not import.
    env = {"CUDASHIM_BACKEND": "cpu", **(HOOK_ENV if route == "hook" else {"PYTHONPATH": str(ROOT)}),
           **(extra_env or {})}
    if route == "launcher":
        return python("-m", "cudashim", str(script), env=env, cwd=tmp_path)
    return python(str(script), env=env, cwd=tmp_path)


@pytest.mark.parametrize("route", ["launcher", "auto", "hook"])
def test_an_uncaught_refusal_ends_at_the_programs_line(route, tmp_path):
    result = _run(route, REFUSING, tmp_path)
    assert result.returncode == 1
    stack = result.stderr.split("Traceback (most recent call last):\n", 1)[1]
    files = [line.split('"')[1] for line in stack.splitlines() if line.startswith('  File "')]
    assert files and all(name.endswith("program.py") for name in files), result.stderr
    assert "return torch.cuda.MemPool()" in stack
    assert stack.rstrip().splitlines()[-1].startswith(
        "cudashim.errors.UnsupportedCudaAPI: torch.cuda.MemPool is not supported by cudashim")


def test_a_device_past_the_count_fails_as_cuda_does_without_cudashims_frames(tmp_path):
    result = _run("launcher", "import torch\nx = torch.zeros(1, device='cuda:3')\n", tmp_path)
    assert result.returncode == 1
    assert "cudashim/" not in result.stderr and "During handling" not in result.stderr, result.stderr
    assert "torch.AcceleratorError: CUDA error: invalid device ordinal 3" in result.stderr


def test_the_programs_own_handlers_still_see_every_frame(tmp_path):
    program = ("import traceback, torch\n"
               "try:\n    torch.cuda.MemPool()\n"
               "except RuntimeError:\n    print('cudashim/patching/refusal.py' in traceback.format_exc())\n")
    result = _run("launcher", program, tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr


def test_an_error_that_is_no_refusal_keeps_every_frame(tmp_path):
    """Only refusals are shortened: any other error raised inside cudashim shows where."""
    result = _run("launcher", "import cudashim\ncudashim.activate(backend='tpu')\n", tmp_path)
    assert result.returncode == 1 and "cudashim/" in result.stderr.split("line 2")[1], result.stderr
    assert "UnknownBackendError" in result.stderr


def test_the_hooks_warning_names_the_programs_import_line(tmp_path):
    """The image hook cannot activate (no such device): the warning points at the program's
    ``import torch``, not at cudashim's or torch's own lines."""
    result = _run("hook", "import os\nimport torch\nprint('ran')\n", tmp_path,
                  extra_env={"CUDASHIM_BACKEND": "xpu"})
    assert result.returncode == 0 and result.stdout.strip() == "ran", result.stderr
    warning, source = result.stderr.splitlines()[:2]
    assert warning.startswith(f"{tmp_path / 'program.py'}:2: CudashimWarning: cudashim did not activate"), warning
    assert source.strip() == "import torch"


def test_a_runtime_warning_names_the_calling_line(tmp_path):
    result = _run("auto", "import torch\n\ntorch.cuda.profiler.start()\n", tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.startswith(f"{tmp_path / 'program.py'}:4: CudashimWarning: torch.cuda.profiler.start"), \
        result.stderr


def test_deactivation_puts_the_excepthook_back(shim):
    import sys
    patched = sys.excepthook
    assert patched is not sys.__excepthook__
    shim.deactivate()
    assert sys.excepthook is sys.__excepthook__
    shim.activate("cpu")
