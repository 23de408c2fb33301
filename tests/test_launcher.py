"""python -m cudashim behaves like python; children are shimmed; the hook never breaks start-up."""

import json
import os
import signal

import pytest

from conftest import ROOT, python

PROBE = """
import sys, os, torch
print(repr(sys.argv))
print(__name__)
print(sys.path[0])
print(torch.zeros(1, device="cuda").is_cuda)
"""


def test_script_gets_python_semantics(tmp_path):
    script = tmp_path / "probe.py"
    script.write_text(PROBE + "sys.exit(3)\n")
    result = python("-m", "cudashim", str(script), "--lr", "1", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    argv, name, path0, is_cuda = result.stdout.splitlines()
    assert argv == repr([str(script), "--lr", "1"]) and name == "__main__"
    assert path0 == str(tmp_path) and is_cuda == "True"


def test_module_and_code(tmp_path):
    (tmp_path / "probe_mod.py").write_text(PROBE)
    result = python("-m", "cudashim", "-m", "probe_mod", "x", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    argv, name, path0, is_cuda = result.stdout.splitlines()
    assert argv == repr([str(tmp_path / "probe_mod.py"), "x"]) and name == "__main__"
    assert path0 == str(tmp_path) and is_cuda == "True"
    result = python("-m", "cudashim", "-c", PROBE, "a", "--b")
    argv, name, path0, is_cuda = result.stdout.splitlines()
    assert argv == repr(["-c", "a", "--b"]) and name == "__main__" and path0 == ""


def test_traceback_reads_as_under_python(tmp_path):
    script = tmp_path / "boom.py"
    script.write_text("def f():\n    raise ValueError('boom')\nf()\n")
    shimmed, plain = python("-m", "cudashim", str(script)), python(str(script), fresh=True)
    assert shimmed.returncode == plain.returncode == 1
    assert shimmed.stderr == plain.stderr


def test_missing_script_fails_as_python_does(tmp_path):
    # Both fresh: python's message names the interpreter, which in a forked program is the zygote's client.
    shimmed = python("-m", "cudashim", "missing.py", cwd=tmp_path, fresh=True)
    plain = python("missing.py", cwd=tmp_path, fresh=True)
    assert shimmed.returncode == plain.returncode == 2
    assert shimmed.stderr == plain.stderr


@pytest.mark.parametrize("args, message", [
    (["--backend", "tpu", "-c", "1"], "unknown cudashim backend 'tpu'; valid: auto, accelerator, cpu, cuda, hpu, mps, npu, xpu"),
    (["--backend", "cuda", "-c", "1"], "cudashim backend 'cuda' cannot run here: no working CUDA"),
    (["--device-count", "x", "-c", "1"], "device_count='x': expected a whole number of devices"),
    (["--device-extension", "no_such_extension", "-c", "1"],
     "the device extension 'no_such_extension' cannot be imported: No module named 'no_such_extension'"),
    ([], "no program given"),
])
def test_bad_options_fail_with_status_2_and_one_line(args, message):
    result = python("-m", "cudashim", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_version_and_help():
    import cudashim
    assert python("-m", "cudashim", "--version").stdout.strip() == f"cudashim {cudashim.__version__}"
    help_text = python("-m", "cudashim", "--help").stdout
    assert "--backend" in help_text and "--report" in help_text


def test_program_options_are_not_taken_for_cudashim_options(tmp_path):
    result = python("-m", "cudashim", "-c", "import sys; print(sys.argv)", "--backend", "mine")
    assert result.returncode == 0 and "'--backend', 'mine'" in result.stdout


def test_subprocess_pythons_are_shimmed_too(tmp_path):
    child = "import torch; print(torch.cuda.is_available(), torch.ones(1).cuda().is_cuda)"
    parent = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}], check=True)"
    result = python("-m", "cudashim", "-c", parent)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "True True"


def test_hook_chains_to_an_existing_sitecustomize_and_survives_bad_settings(tmp_path):
    image_site = tmp_path / "image"
    image_site.mkdir()
    (image_site / "sitecustomize.py").write_text("import os; os.environ['IMAGE_HOOK_RAN'] = '1'\n")
    hook = str(ROOT / "sitecustomize")
    env = {"PYTHONPATH": os.pathsep.join([hook, str(ROOT), str(image_site)]), "CUDASHIM_ACTIVATE": "1"}
    probe = "import os, sys, torch; print(os.environ.get('IMAGE_HOOK_RAN'), torch.cuda.is_available())"
    result = python("-c", probe, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "True"]
    bad = python("-c", probe, env={**env, "CUDASHIM_DEVICE_COUNT": "lots"})
    assert bad.returncode == 0 and bad.stdout.split() == ["1", "False"]
    assert bad.stderr.count("CudashimWarning: cudashim is not active") == 1
    no_torch = python("-c", "import sys; print('torch' in sys.modules)", env=env)
    assert no_torch.stdout.strip() == "False", "the hook must not import torch at start-up"
    for flag in ("-S", "-I"):
        assert python(flag, "-c", "print('up')", env=env).stdout.strip() == "up"


def test_import_cudashim_auto_as_the_first_line_shims_children_too(tmp_path):
    child = "import torch; print(torch.ones(1).cuda().is_cuda, torch.cuda.device_count())"
    script = tmp_path / "train.py"
    script.write_text("import cudashim.auto\nimport subprocess, sys, torch\n"
                      "print(torch.ones(2).cuda().is_cuda, flush=True)\n"
                      f"subprocess.run([sys.executable, '-c', {child!r}], check=True)\n")
    result = python(str(script), env={"PYTHONPATH": str(ROOT), "CUDASHIM_DEVICE_COUNT": "2"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "2"]     # the program's settings, too


def test_report_lists_apis_with_counts_and_first_call_site_per_rank(tmp_path):
    script = tmp_path / "uses.py"
    script.write_text("import torch\nfor _ in range(3):\n    x = torch.zeros(2, device='cuda')\n"
                      "    devices = torch.device('cuda'), torch.device('cpu')\n"
                      "torch.cuda.synchronize()\n")
    result = python("-m", "cudashim", "--report", "--report-json", str(tmp_path / "r.json"),
                    str(script), env={"RANK": "1"})
    assert result.returncode == 0, result.stderr
    assert "torch.zeros" in result.stderr and "rank 1" in result.stderr
    report = json.loads((tmp_path / "r.rank1.json").read_text())
    assert report["apis"]["torch.zeros"] == {"calls": 3, "became": "cpu", "first_call": f"{script}:3"}
    assert report["apis"]["torch.cuda.synchronize"]["calls"] == 1
    assert report["apis"]["torch.device"]["calls"] == 3     # every call counted, "cpu" never
    assert "torch.cuda.manual_seed_all" not in report["apis"]


def test_cudashim_command_run_and_doctor():
    result = python("-c", "from cudashim.cli import main; main()", "run", "-c",
                    "import torch; print(torch.ones(1).cuda().is_cuda)")
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr
    doctor = python("-c", "from cudashim.cli import main; main()", "doctor")
    assert doctor.returncode == 0, doctor.stdout
    for expected in ("torch 2.", "chosen backend: cpu", "collectives: NCCL becomes 'gloo'",
                     "policies:", "vendor packages:", "self-check: pass"):
        assert expected in doctor.stdout


# --- the launcher is python: the same program, the same answers --------------------------
PATHS = """
import sys, __main__
def f(x: int): pass
print(__file__, sys.argv, sys.path[0], __name__, __package__, __spec__ and __spec__.name, __cached__)
print(type(__loader__).__name__, __main__.__file__, __main__.__dict__ is globals())
print(sorted(name for name in globals() if name.startswith('__')), f.__annotations__)
"""
THREAD = """
import threading
def work(): raise RuntimeError('in a thread')
thread = threading.Thread(target=work, name='worker'); thread.start(); thread.join()
print('main goes on')
"""
ENDINGS = """
import atexit, sys
atexit.register(lambda: print('registered first, runs last', file=sys.stderr))
atexit.register(lambda: print('registered last, runs first', file=sys.stderr))
try:
    {body}
finally:
    print('finally', file=sys.stderr)
"""
WARNINGS = """
import sys, warnings, torch
print(sys.warnoptions, [f[0] for f in warnings.filters[:3]])
warnings.warn('deprecated here', DeprecationWarning)
warnings.warn('a user warning')
print('after the warnings')
"""
FLAGS = """
import sys
print(__debug__, sys.flags.optimize, sys.flags.dev_mode, sys.stdout.write_through, sys.flags.verbose)
assert False, 'asserts run'
"""
MATRIX = {
    "paths": ((), PATHS, ("--lr", "1")),
    "traceback": ((), "def inner():\n    raise ValueError('boom')\ndef outer():\n    inner()\nouter()\n", ()),
    "syntax error": ((), "def f(:\n    pass\n", ()),
    "exit status": ((), "import sys\nsys.exit(3)\n", ()),
    "exit message": ((), "import sys\nsys.exit('bye')\n", ()),
    "exit object": ((), "import sys\nclass Done:\n    def __str__(self): return 'done'\nsys.exit(Done())\n", ()),
    "exception in a thread": ((), THREAD, ()),
    "atexit and finally": ((), ENDINGS.format(body="raise RuntimeError('late')"), ()),
    "ctrl-c": ((), ENDINGS.format(body="import os, signal; os.kill(os.getpid(), signal.SIGINT)"), ()),
    "warnings": ((), WARNINGS, ()),
    "-W error": (("-W", "error::UserWarning"), WARNINGS, ()),
    "-O": (("-O",), FLAGS, ()),
    "-X dev -u": (("-X", "dev", "-u"), FLAGS, ()),
}


def test_the_launcher_is_python_for_the_same_program(tmp_path):
    """Each program of the matrix, run as ``python [options] sub/prog.py`` and as
    ``python -m cudashim [options] sub/prog.py`` from the same folder: the same exit status
    (death by SIGINT for Ctrl-C), standard output and standard error."""
    from concurrent.futures import ThreadPoolExecutor

    def both(case):
        options, source, args = MATRIX[case]
        folder = tmp_path / case.replace(" ", "_")
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "prog.py").write_text(source)
        runs = [python(*launcher, *options, "sub/prog.py", *args, cwd=folder)
                for launcher in ((), ("-m", "cudashim"))]
        return [(run.returncode, run.stdout, run.stderr) for run in runs]

    # A shell starts its background jobs with SIGINT ignored, and both Pythons would inherit
    # that: give them the disposition a terminal gives, so that the Ctrl-C case means Ctrl-C.
    inherited = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with ThreadPoolExecutor(max_workers=2) as pool:
            seen = dict(zip(MATRIX, pool.map(both, MATRIX)))
    finally:
        signal.signal(signal.SIGINT, inherited)
    assert seen["ctrl-c"][0][0] == -2 and seen["exit object"][0][0] == 1   # python's, to match
    for case, (plain, shimmed) in seen.items():
        assert shimmed == plain, case


def test_module_and_code_as_python_runs_them(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "main.py").write_text(PATHS + "raise SystemExit(4)\n")
    for program in (("-m", "pkg.main", "x"), ("-c", PATHS, "a", "--b")):
        plain, shimmed = (python(*launcher, *program, cwd=tmp_path) for launcher in ((), ("-m", "cudashim")))
        assert (shimmed.returncode, shimmed.stdout, shimmed.stderr) == \
            (plain.returncode, plain.stdout, plain.stderr), program


WHOLE_REPORT = """
import os, sys, torch
stream = torch.cuda.Stream()
with torch.cuda.stream(stream):
    x = torch.ones(3).cuda()
torch.cuda.current_stream().wait_stream(stream)
event = torch.cuda.Event(enable_timing=True)
event.record()
legacy = torch.cuda.FloatTensor(2)
assert isinstance(legacy, torch.cuda.FloatTensor) and isinstance(stream, torch.cuda.Stream)
pinned = torch.ones(2).pin_memory()
torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
print(torch.version.cuda, torch.backends.cudnn.version(), torch.backends.cuda.is_built())
os.rmdir(sys.argv[1])                 # the report's folder is gone by the time it is written
"""


def test_the_report_lists_every_cuda_api_that_ran_and_fails_early_on_a_bad_path(tmp_path):
    script = tmp_path / "uses.py"
    script.write_text(WHOLE_REPORT)
    (tmp_path / "gone").mkdir()
    result = python("-m", "cudashim", "--report", "--report-json", str(tmp_path / "gone" / "r.json"),
                    str(script), str(tmp_path / "gone"))
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr
    assert result.stderr.count("cudashim: the report could not be written to") == 1
    for api in ("torch.cuda.Stream", "torch.cuda.stream", "torch.cuda.current_stream", "torch.cuda.Event",
                "torch.cuda.FloatTensor", "isinstance(..., torch.cuda.FloatTensor)",
                "isinstance(..., torch.cuda.Stream)", "Tensor.pin_memory",
                "torch.backends.cudnn.benchmark =", "torch.backends.cudnn.deterministic =",
                "torch.backends.cuda.matmul.allow_tf32 =", "torch.backends.cudnn.allow_tf32 =",
                "torch.version.cuda", "torch.backends.cudnn.version", "torch.backends.cuda.is_built"):
        assert f"\n{api} " in result.stderr, api
    for bad, problem in ((tmp_path / "missing" / "r.json", "there is no folder"), (tmp_path, "it is a folder")):
        refused = python("-m", "cudashim", "--report-json", str(bad), "-c", "print('ran')")
        assert refused.returncode == 2 and refused.stdout == "", refused.stderr
        assert refused.stderr.strip().splitlines() == [
            f"cudashim: error: report_json={bad}: cannot write the report to {bad}: {problem}"
            + (f" {bad.parent}" if problem == "there is no folder" else "")]
    assert not (tmp_path / "missing").exists()               # no folder made that was not asked for
