"""The suite's zygote (tests/zygote.py): a program forked from it starts as the same command in a
fresh interpreter does, ends as it does, and is started afresh where it could not."""

import json
import os
import signal
import subprocess
import sys

import pytest

import zygote
from conftest import python

# What a program sees as it starts, printed as JSON: everything a forked start sets up.
START_STATE = r'''
import json, os, signal, sys
def stream(s):
    return None if s is None else [s.encoding, s.errors, s.line_buffering, s.write_through,
                                   getattr(s.buffer, "raw", s.buffer).__class__.__name__]
main = sys.modules["__main__"]
torch_before = "torch" in sys.modules or "torch.nn" in sys.modules
import torch
print(json.dumps({
    "torch": [torch_before, torch.__spec__.origin, type(torch.__spec__.loader).__name__,
              "torch.nn" in sys.modules, torch.ones(2).sum().item()],
    "argv": sys.argv, "path0": sys.path[0], "cwd": os.getcwd(),
    "path_before_stdlib": sys.path[1:sys.path.index(os.path.dirname(os.__file__))],
    "name": __name__, "file": main.__dict__.get("__file__"), "spec": main.__spec__ and [main.__spec__.name, main.__spec__.origin],
    "loader": type(main.__loader__).__name__, "package": main.__package__,
    "variable": os.environ.get("ZYGOTE_TEST_VARIABLE"),
    "streams": [stream(s) for s in (sys.stdin, sys.stdout, sys.stderr)],
    "handlers": [str(signal.getsignal(n)) for n in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD,
                                                    signal.SIGPIPE, signal.SIGHUP)],
    "fds": sorted(int(fd) for fd in os.listdir("/proc/self/fd") if fd not in ("0", "1", "2"))[:-1],
    "sitecustomize": getattr(sys.modules.get("sitecustomize"), "MARK", None),
    "stdin": sys.stdin.read() if sys.stdin is not None else None,
}))
'''


def _zygote_up():
    """The worker's zygote, waited for until it serves (it imports torch first)."""
    running = zygote._running
    if running is None:
        pytest.skip("the suite runs with --fresh-interpreters")
    assert running.serving(timeout=120), "the zygote ended, or did not serve within 120 s"
    return running


def _both(*args, **options):
    """The command forked from the zygote and started afresh; their CompletedProcesses."""
    _zygote_up()
    return python(*args, **options), python(*args, fresh=True, **options)


@pytest.fixture
def layout(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "state.py").write_text(START_STATE)
    (tmp_path / "state.py").write_text(START_STATE)
    hook = tmp_path / "hook"
    hook.mkdir()
    (hook / "sitecustomize.py").write_text("MARK = 'the hook ran'\n")
    return tmp_path


@pytest.mark.parametrize("command", [["state.py", "a", "--b"], ["-m", "pkg.state", "x"],
                                     ["-c", START_STATE, "y", "z"], ["-u", "state.py"]],
                         ids=["script", "module", "code", "unbuffered"])
def test_a_forked_program_starts_as_a_fresh_one(layout, command):
    env = {"ZYGOTE_TEST_VARIABLE": "given", "PYTHONPATH": str(layout / "hook")}
    forked, fresh = _both(*command, cwd=layout, env=env, input="on stdin\n")
    assert fresh.returncode == 0, fresh.stderr
    assert forked.returncode == 0, forked.stderr
    assert json.loads(forked.stdout) == json.loads(fresh.stdout)
    assert json.loads(forked.stdout)["sitecustomize"] == "the hook ran"
    assert forked.stderr == fresh.stderr == ""


def test_a_program_started_ignoring_signals_keeps_ignoring_them(layout):
    """nohup, or a script's job in the background, starts a program with SIGHUP or SIGINT
    ignored; a fresh interpreter keeps them ignored (no KeyboardInterrupt), and so must a forked one."""
    ignoring = (signal.SIGINT, signal.SIGHUP)
    before = {number: signal.signal(number, signal.SIG_IGN) for number in ignoring}
    try:
        forked, fresh = _both("state.py", cwd=layout, input="")
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    assert fresh.returncode == 0 and forked.returncode == 0, (fresh.stderr, forked.stderr)
    handlers = json.loads(fresh.stdout)["handlers"]          # SIGINT, SIGTERM, SIGCHLD, SIGPIPE, SIGHUP
    assert [handlers[0], handlers[4]] == [str(signal.SIG_IGN)] * 2
    assert json.loads(forked.stdout) == json.loads(fresh.stdout)


def test_it_is_forked_not_started(layout):
    """The program's interpreter is the zygote's, which imported torch, and numpy with it, and
    sympy, which torch._dynamo imports, before the program ran (torch's own modules wait for the
    program's import of torch)."""
    probe = "import sys; print('numpy' in sys.modules, 'sympy' in sys.modules, sys.executable)"
    forked, fresh = _both("-c", probe, cwd=layout)
    assert forked.stdout.split() == ["True", "True", str(zygote._running.executable)]
    assert fresh.stdout.split() == ["False", "False", sys.executable]


@pytest.mark.parametrize("program", [
    "import sys; sys.exit(3)",
    "import sys; sys.exit('a message')",
    "def f():\n    raise ValueError('boom')\nf()",
    "raise KeyboardInterrupt",
    "import os, signal; os.kill(os.getpid(), signal.SIGTERM)",
    "import atexit, threading, time\n"
    "atexit.register(print, 'at exit')\n"
    "threading.Thread(target=lambda: (time.sleep(0.3), print('thread done'))).start()",
], ids=["status", "message", "exception", "interrupt", "signal", "atexit-and-threads"])
def test_a_forked_program_ends_as_a_fresh_one(layout, program):
    forked, fresh = _both("-c", program, cwd=layout)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)


def test_descriptors_a_parent_passes_on_reach_the_program(layout):
    """As multiprocessing's spawn hands its pipes over: by number."""
    read, write = os.pipe()
    program = f"import os; os.write({write}, b'through the pipe'); os.close({write})"
    child = subprocess.run([str(_zygote_up().executable), "-c", program], pass_fds=(write,), cwd=layout,
                           capture_output=True, text=True, timeout=120)
    os.close(write)
    assert child.returncode == 0, child.stderr
    assert os.read(read, 100) == b"through the pipe"


def test_a_signal_to_the_stand_in_reaches_the_program(layout):
    # The program writes with os.write: a handler that prints could run inside the print of
    # "ready" (the test reads it before print returns), where print cannot be entered again.
    program = ("import os, signal, sys, time\n"
               "signal.signal(signal.SIGTERM, lambda *_: (os.write(1, b'got it\\n'), sys.exit(7)))\n"
               "os.write(1, b'ready\\n')\n"
               "time.sleep(60)\n")
    child = subprocess.Popen([str(_zygote_up().executable), "-c", program], cwd=layout,
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\n"
    child.send_signal(signal.SIGTERM)
    assert child.wait(timeout=60) == 7
    assert child.stdout.read() == "got it\n"


def test_a_killed_stand_in_takes_its_program_with_it(layout):
    """A test's timeout kills what it started; the program it stands for must not run on."""
    program = "import os, time; print(os.getpid(), flush=True); time.sleep(60)"
    child = subprocess.Popen([str(_zygote_up().executable), "-c", program], cwd=layout,
                             stdout=subprocess.PIPE, text=True)
    pid = int(child.stdout.readline())
    child.kill()
    child.wait()
    for _ in range(100):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        import time
        time.sleep(0.1)
    pytest.fail(f"the program {pid} still runs")


@pytest.mark.parametrize("difference", ["option", "variable", "library-variable", "shadowing"])
def test_what_a_fork_could_not_honour_starts_afresh(layout, difference):
    args, env = ["-c", "import sys; print('numpy' in sys.modules, sys.executable)"], {}
    if difference == "option":
        args = ["-X", "utf8", *args]
    elif difference == "variable":
        env["PYTHONHASHSEED"] = "7"                 # read as the interpreter starts
    elif difference == "library-variable":
        env["SYMPY_USE_CACHE"] = "no"               # read as the zygote imported sympy
    else:
        (layout / "numpy.py").write_text("")       # shadows a module the zygote imported
    forked, fresh = _both(*args, cwd=layout, env=env)
    assert forked.stdout == fresh.stdout == f"False {sys.executable}\n", forked.stderr
