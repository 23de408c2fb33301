"""Every test runs in a forked child (pytest --forked, set in pyproject.toml): patching
torch is process-wide, and the parent must stay clean for the next test."""

import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

import zygote

ROOT = Path(__file__).resolve().parent.parent
PARENT_PID = os.getpid()
pytest_plugins = ("suite_run",)        # how the suite runs: options, order, builds, heartbeat
# The cudashim variables a test run hands on to the interpreters it starts (suite_run sets them
# from --pure-python and --host-profile, and where the measurements of this CPU are kept).
PASSED_ON = ("CUDASHIM_PURE_PYTHON", "CUDASHIM_HOST_PROFILE", "CUDASHIM_CACHE_DIR")
# On a machine with a GPU the parent must not start CUDA: a forked test cannot use a CUDA the
# parent started ("Cannot re-initialize CUDA in forked subprocess"). A skipif's
# torch.cuda.is_available(), read at collection in the parent, asks NVML instead where torch's
# PYTORCH_NVML_BASED_CUDA_CHECK is set; the programs the tests start get the variable as it was.
_NVML_CHECK = "PYTORCH_NVML_BASED_CUDA_CHECK"
_NVML_CHECK_GIVEN = os.environ.get(_NVML_CHECK)
os.environ[_NVML_CHECK] = "1"


def pytest_sessionstart(session):
    """Import in this parent what an activation imports: every test activates cudashim in a fresh
    fork of it, which then inherits those modules (a process's first activation takes about 135 ms,
    two thirds of it importing; a later one 35 ms). Importing a group's module patches nothing."""
    if hasattr(session.config, "workerinput") or not session.config.pluginmanager.hasplugin("dsession"):
        if not session.config.getoption("--fresh-interpreters"):
            zygote.start(_program_env())
        import torch  # noqa: F401

        from cudashim import patches
        for name in patches.names():
            patches.group_module(name)


def pytest_sessionfinish(session):
    zygote.stop()


def host_profile() -> str:
    """The host profile this run's programs see (``--host-profile``; by default measured)."""
    from cudashim._settings import load
    return load().host_profile


def once(tmp_path_factory, name, make):
    """``make(folder)`` run once for the whole test session (all xdist workers), its folder
    shared: a reference run that several tests compare with serves them all."""
    import fcntl
    shared = tmp_path_factory.getbasetemp().parent / f"once-{name}"
    shared.mkdir(exist_ok=True)
    with open(shared.parent / f"once-{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (shared / "done").exists():
            make(shared)
            (shared / "done").write_text("")
    return shared


@pytest.fixture
def one_rank_ddp(tmp_path_factory):
    """tests/programs/ddp_train.py on one rank with the batch two ranks of 8 share: the weights
    (on the host) every two-rank layout of it must equal."""
    def make(folder):
        result = torchrun("tests/programs/ddp_train.py", "--batch-size", "16", "--out", str(folder / "one.pt"),
                          nproc=1, timeout=240)
        assert result.returncode == 0, result.stderr[-3000:]
    import torch
    return torch.load(once(tmp_path_factory, "one-rank-ddp", make) / "one.pt")


def _clean_env():
    env = {k: v for k, v in os.environ.items() if not k.startswith("CUDASHIM_") or k in PASSED_ON}
    env.pop(_NVML_CHECK, None)
    if _NVML_CHECK_GIVEN is not None:
        env[_NVML_CHECK] = _NVML_CHECK_GIVEN
    return env


@pytest.fixture(autouse=True)
def _runs_forked():
    assert os.getpid() != PARENT_PID, "tests must run forked (pytest --forked)"
    import cudashim
    assert not cudashim.is_active(), "cudashim leaked into the test parent"
    yield


@pytest.fixture
def shim():
    """cudashim active on the CPU backend, in this forked test process."""
    import torch  # noqa: F401
    import cudashim
    cudashim.activate("cpu")
    yield cudashim
    cudashim.deactivate()


def _program_env(env=None) -> dict:
    """The environment of a program a test starts: the user's, without cudashim's settings or
    PYTHONPATH, with ``env`` on top."""
    full_env = _clean_env()
    full_env.pop("PYTHONPATH", None)
    full_env.update(env or {})
    return full_env


def explained_and_compiled(module, *inputs):
    """``module`` on ``inputs`` under no_grad: its eager result, torch._dynamo.explain's account
    (asserted one graph without a break), and its result compiled by AOTAutograd's eager backend
    (what inductor captures, without generating code)."""
    import warnings

    import torch
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")                  # dynamo's own notices
        eager = module(*inputs)
        explained = torch._dynamo.explain(module)(*inputs)
        torch._dynamo.reset()
        compiled = torch.compile(module, backend="aot_eager")(*inputs)
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), \
        [str(reason.reason)[:300] for reason in explained.break_reasons]
    return eager, explained, compiled


def python(*args, env=None, cwd=None, timeout=300, input=None, fresh=False):
    """Run ``python ARGS`` as a new interpreter would; return the CompletedProcess (text).

    It is forked from the suite's zygote, which has imported torch (tests/zygote.py), where that
    is the same; ``fresh=True`` starts an interpreter of its own."""
    interpreter = sys.executable if fresh else zygote.executable()
    return subprocess.run([interpreter, *args], capture_output=True, text=True, env=_program_env(env),
                          cwd=cwd or ROOT, timeout=timeout, input=input)


def installed_distribution(where: Path, name: str, entry_points: str) -> None:
    """A distribution's metadata under ``where`` (on PYTHONPATH, it is installed), declaring
    ``entry_points`` (an entry_points.txt's text), as a package that extends cudashim does."""
    dist_info = where / f"{name.replace('-', '_')}-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(entry_points)


def copy_of_cudashim(where: Path) -> Path:
    """The installed cudashim package copied under ``where``, to change and run on PYTHONPATH."""
    import shutil

    import cudashim
    package = where / "cudashim"
    shutil.copytree(Path(cudashim.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    return package


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun(*args, nproc=2, timeout=300, env=None, shim_options=()):
    """``python -m cudashim [shim_options] -m torch.distributed.run --standalone ...``."""
    return python("-m", "cudashim", *shim_options, "-m", "torch.distributed.run", "--standalone",
                  "--nproc-per-node", str(nproc), *args, timeout=timeout, env=env)


def torchrun_two_nodes(*args, env=None, timeout=240):
    """Two torchrun "nodes" of one process each on 127.0.0.1, both under the launcher;
    return [(returncode, stderr)] per node."""
    port = free_port()
    full_env = _program_env(env)
    nodes = [subprocess.Popen(
        [zygote.executable(), "-m", "cudashim", "-m", "torch.distributed.run", "--nnodes", "2",
         "--node-rank", str(node), "--nproc-per-node", "1", "--master-addr", "127.0.0.1",
         "--master-port", str(port), *args],
        cwd=ROOT, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for node in (0, 1)]
    errors = [node.communicate(timeout=timeout)[1] for node in nodes]
    return [(node.returncode, error) for node, error in zip(nodes, errors)]


FAKES = ROOT / "tests" / "fakes"
# The fake vendor packages each backend imports; "musa" is a vendor cudashim does not know.
FAKE_VENDORS = ("npu", "hpu", "xpu", "musa")


def fake_vendor_path(vendor: str) -> str:
    """PYTHONPATH that makes a fresh interpreter see one fake vendor package."""
    assert vendor in FAKE_VENDORS, vendor
    return os.pathsep.join([str(FAKES), str(FAKES / "vendors" / vendor)])


def use_fake_vendor(vendor: str) -> None:
    """Make this forked test process see one fake vendor package (never the parent)."""
    assert os.getpid() != PARENT_PID, "fakes are installed in forked test processes only"
    for path in reversed(fake_vendor_path(vendor).split(os.pathsep)):
        sys.path.insert(0, path)


def install_fake(name):
    """Give this forked process the fake device (and vendor package) for backend ``name``."""
    if name in ("xpu", "npu", "hpu"):
        use_fake_vendor(name)
    elif name == "mps":
        sys.path.insert(0, str(FAKES))
        importlib.import_module("fake_mps").install()
    elif name == "accelerator":
        use_fake_vendor("musa")
        importlib.import_module("torch_musa")._autoload()   # what torch's autoload would call
