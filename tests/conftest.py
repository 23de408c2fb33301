"""Every test runs in a forked child (pytest --forked, set in pyproject.toml): patching
torch is process-wide, and the parent must stay clean for the next test."""

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PARENT_PID = os.getpid()
# The one cudashim variable a test run hands on to the interpreters it starts: the suite's
# second pass (``pytest --pure-python``) runs everything on the pure-Python wrappers.
PURE_PYTHON = "CUDASHIM_PURE_PYTHON"


def pytest_addoption(parser):
    parser.addoption("--pure-python", action="store_true",
                     help="run cudashim's pure-Python wrappers and kernels, not the compiled ones")


@pytest.hookimpl(trylast=True)          # after the terminal reporter exists
def pytest_configure(config):
    if config.getoption("--pure-python"):
        os.environ[PURE_PYTHON] = "1"
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and not hasattr(config, "workerinput"):    # xdist's workers print nothing
        config.pluginmanager.register(Heartbeat(reporter), "cudashim-heartbeat")


class Heartbeat:
    """A line when the suite has printed nothing for a while, naming the tests still running:
    a long end-to-end test reads differently from a hung one, and a CI log never goes quiet."""
    QUIET = 45.0                                     # seconds without a line before one

    def __init__(self, reporter):
        import threading
        self.reporter = reporter
        self.running = {}                            # node id -> when it started
        self.last_line = time.monotonic()
        self.lock = threading.Lock()
        self.stopped = threading.Event()
        threading.Thread(target=self._beat, name="heartbeat", daemon=True).start()

    def pytest_runtest_logstart(self, nodeid):
        with self.lock:
            self.running[nodeid] = time.monotonic()

    def pytest_runtest_logreport(self, report):
        with self.lock:
            self.last_line = time.monotonic()
            if report.when == "teardown":
                self.running.pop(report.nodeid, None)

    def pytest_unconfigure(self):
        self.stopped.set()

    def _beat(self):
        while not self.stopped.wait(5.0):
            now = time.monotonic()
            with self.lock:
                if now - self.last_line < self.QUIET or not self.running:
                    continue
                self.last_line = now
                running = sorted(self.running.items(), key=lambda item: item[1])
            names = ", ".join(f"{nodeid} ({now - started:.0f} s)" for nodeid, started in running)
            self.reporter.write_line(f"... still running: {names}")


def _clean_env():
    return {k: v for k, v in os.environ.items() if not k.startswith("CUDASHIM_") or k == PURE_PYTHON}


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


def python(*args, env=None, cwd=None, timeout=300, input=None):
    """Run a fresh interpreter; return the CompletedProcess (text)."""
    full_env = _clean_env()
    full_env.pop("PYTHONPATH", None)
    full_env.update(env or {})
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, env=full_env,
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
    full_env = _clean_env()
    full_env.pop("PYTHONPATH", None)
    full_env.update(env or {})
    nodes = [subprocess.Popen(
        [sys.executable, "-m", "cudashim", "-m", "torch.distributed.run", "--nnodes", "2",
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
