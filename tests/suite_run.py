"""How the suite runs, as a pytest plugin (conftest loads it): its options, the order its tests
start in, the builds it keeps between runs, a line when it goes quiet, and what to type when a
test fails.

- ``--pure-python`` and ``--host-profile NAME`` set the cudashim variable every interpreter a
  test starts inherits (conftest.PASSED_ON).
- Tests start longest first, by the durations the last run of the same pass measured on this
  machine (kept under the suite's cache): two workers then end on short tests together instead
  of one idling while the other finishes a long run. A test no run measured yet starts first.
- Torch's extension builds (the test accelerator, DeepSpeed's CPU ops) are kept between runs,
  keyed by what they are built from (torch, Python, machine; DeepSpeed's version and the place
  of its environment); inductor's compiled code between environments and runs (keyed by torch,
  Python, machine and torch's kernels).
- What the precision policy measures on this CPU is kept there too (``CUDASHIM_CACHE_DIR``),
  never in the user's own cache.
- Every test process, and every program a test starts, computes on one intra-op thread
  (``OMP_NUM_THREADS=1`` unless set): the two workers keep the cores busy already.
"""

import json
import os
import platform
import shlex
import sys
import threading
import time
from pathlib import Path

import pytest

PURE_PYTHON = "CUDASHIM_PURE_PYTHON"
HOST_PROFILE = "CUDASHIM_HOST_PROFILE"
MEASUREMENTS = "CUDASHIM_CACHE_DIR"
# A lock torch's extension builder left this long ago belongs to a build that was killed: the
# builds here take minutes, and torch waits on a lock file for ever.
STALE_BUILD_LOCK = 20 * 60
# A copy of the last run's durations, taken by the controller before its workers start: every
# worker must collect the same order, whatever a run beside this one writes meanwhile.
ORDER = "CUDASHIM_TESTS_ORDER_BY"


def pytest_addoption(parser):
    parser.addoption("--pure-python", action="store_true",
                     help="run cudashim's pure-Python wrappers and kernels, not the compiled ones")
    parser.addoption("--host-profile", default=None, metavar="NAME",
                     help="run as on a CPU of this host profile (cudashim --host-profile): "
                          "measured, fast, bfloat16, slow")
    parser.addoption("--fresh-interpreters", action="store_true",
                     help="start every program a test runs in an interpreter of its own, not "
                          "forked from the zygote that has imported torch (tests/zygote.py)")


def _is_controller(config) -> bool:
    return not hasattr(config, "workerinput")        # xdist's workers have it


@pytest.hookimpl(trylast=True)          # after the terminal reporter exists
def pytest_configure(config):
    if _is_controller(config):          # before xdist's workers start: they inherit all of it
        builds = suite_cache() / "builds" / (
            f"torch-{_torch_version()}-py{sys.version_info[0]}{sys.version_info[1]}-{platform.machine()}")
        os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                              str(extension_builds(builds / _extensions_folder())))
        # Inductor's cache does not key its code by torch's kernels: code made for AVX-512 and
        # read under ATEN_CPU_CAPABILITY=default fails to compile. A folder for each.
        kernels = os.environ.get("ATEN_CPU_CAPABILITY") or "native"
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(builds / f"inductor-{kernels}"))
        # What the precision policy times on this CPU is kept where the suite keeps its builds,
        # not among the user's caches: the suite's load is not the user's machine.
        os.environ.setdefault(MEASUREMENTS, str(builds / f"measurements-{kernels}"))
        # One intra-op thread in every test process and the programs they start, as torchrun
        # gives each rank: the workers already keep every core busy, and a program's OpenMP
        # threads then spin for cores they do not get (a quarter of the suite's CPU time, in
        # the example tests). Tests of threaded kernels set their thread counts themselves.
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    if config.getoption("--pure-python"):
        os.environ[PURE_PYTHON] = "1"
    if config.getoption("--host-profile"):
        os.environ[HOST_PROFILE] = config.getoption("--host-profile")
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    if reporter is not None and _is_controller(config):                # workers print nothing
        config.pluginmanager.register(Heartbeat(reporter), "cudashim-heartbeat")
        config.pluginmanager.register(RerunLines(config), "cudashim-rerun-lines")
        durations = Durations(_durations_file(config))
        config.pluginmanager.register(durations, "cudashim-durations")
        os.environ[ORDER] = str(durations.snapshot())


def suite_cache() -> Path:
    """What the suite keeps between runs on this machine, beside the user's other caches."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cudashim-tests"


def _torch_version() -> str:
    from importlib.metadata import version
    return version("torch")


def _extensions_folder() -> str:
    """Where torch's extension builds go, under the folder of this torch, Python and machine.

    One folder for every environment without DeepSpeed, in every checkout: the test accelerator
    files each build by a hash of its sources and the torch it is for, and loads one made before
    without a build command, so a fresh clone's environments take the build an earlier one made.

    DeepSpeed's CPU ops (cpu_adam, fused_adam, shm_comm: 150 CPU-seconds here) are built by ninja,
    which rebuilds an object when its command changes (the include paths name the environment) or
    a source is newer; pip writes every file it installs with the time it installs it. So an
    environment with DeepSpeed gets a folder of its own version and its place, and DeepSpeed's
    sources are given one fixed time there (``_settle_deepspeed_sources``): the environment made
    again at the same place, as a fresh clone's CI makes it, takes the last one's builds.
    torch's headers come in as system headers (-isystem), which ninja does not follow."""
    from importlib.util import find_spec
    spec = find_spec("deepspeed")
    if spec is None or not spec.submodule_search_locations:
        return "extensions"
    from hashlib import sha256
    from importlib.metadata import version
    place = sha256(sys.prefix.encode()).hexdigest()[:12]
    _settle_deepspeed_sources(Path(spec.submodule_search_locations[0]) / "ops" / "csrc")
    return f"extensions-deepspeed-{version('deepspeed')}-{place}"


# What DeepSpeed's sources are dated in a test environment: older than any build made from them.
SETTLED_SOURCES = 946684800              # 2000-01-01


def _settle_deepspeed_sources(sources: Path) -> None:
    for path in sources.rglob("*"):
        try:
            if path.is_file() and path.stat().st_mtime != SETTLED_SOURCES:
                os.utime(path, (SETTLED_SOURCES, SETTLED_SOURCES))
        except OSError:                 # a read-only installation: its builds are made again
            return


def extension_builds(folder: Path) -> Path:
    """``folder`` made, with the locks of killed builds in it cleared (torch's builds lock
    ``NAME/lock``, the test accelerator's ``NAME/HASH/lock``)."""
    folder.mkdir(parents=True, exist_ok=True)
    for lock in (*folder.glob("*/lock"), *folder.glob("*/*/lock")):
        try:
            if time.time() - lock.stat().st_mtime > STALE_BUILD_LOCK:
                lock.unlink()
        except OSError:
            pass
    return folder


# --- order -------------------------------------------------------------------------------
def _pass_name(config) -> str:
    """The pass a run is (its tox stage and options): each keeps durations of its own."""
    parts = [os.environ.get("TOX_ENV_NAME", "pytest")]
    if config.getoption("--pure-python"):
        parts.append("pure-python")
    if config.getoption("--host-profile"):
        parts.append(config.getoption("--host-profile"))
    if os.environ.get("ATEN_CPU_CAPABILITY"):
        parts.append(os.environ["ATEN_CPU_CAPABILITY"])
    return "-".join(parts)


def _durations_file(config) -> Path:
    return suite_cache() / "durations" / f"{_pass_name(config)}.json"


def pytest_collection_modifyitems(config, items):
    """Longest first, by the last run's durations; unmeasured tests first, in their order."""
    try:
        known = json.loads(Path(os.environ[ORDER]).read_text())
    except (KeyError, OSError, ValueError):
        return
    items.sort(key=lambda item: -known.get(item.nodeid, float("inf")))


class Durations:
    """Records each test's duration (setup, call and teardown) in the controller and keeps them
    for the next run of the same pass."""

    def __init__(self, path: Path):
        self.path = path
        self.seen = {}
        self.copy = None

    def snapshot(self) -> Path:
        """A copy of the durations as they are now, for the workers to order by."""
        import tempfile
        handle, name = tempfile.mkstemp(prefix="cudashim-tests-order-", suffix=".json")
        with os.fdopen(handle, "w") as copy:
            copy.write(self.path.read_text() if self.path.is_file() else "{}")
        self.copy = Path(name)
        return self.copy

    def pytest_unconfigure(self):
        if self.copy is not None:
            self.copy.unlink(missing_ok=True)

    def pytest_runtest_logreport(self, report):
        self.seen[report.nodeid] = self.seen.get(report.nodeid, 0.0) + report.duration

    def pytest_sessionfinish(self):
        if not self.seen:
            return
        try:
            known = json.loads(self.path.read_text())
        except (OSError, ValueError):
            known = {}
        known.update({nodeid: round(seconds, 2) for nodeid, seconds in self.seen.items()})
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            partial = self.path.with_suffix(f".{os.getpid()}.tmp")
            partial.write_text(json.dumps(known, indent=0, sort_keys=True))
            partial.replace(self.path)                  # atomic: a run beside this one reads all or none
        except OSError:
            pass


# --- what the log says -------------------------------------------------------------------
class RerunLines:
    """At the end, for each test that failed: the stage it failed in and the one command that
    reruns it there, so a red CI log says what a newcomer types next."""

    def __init__(self, config):
        self.config = config

    def pytest_terminal_summary(self, terminalreporter):
        failed = [report.nodeid for kind in ("failed", "error")
                  for report in terminalreporter.stats.get(kind, []) if getattr(report, "nodeid", "")]
        if not failed:
            return
        stage = os.environ.get("TOX_ENV_NAME")
        options = []
        if self.config.getoption("--pure-python"):
            options.append("--pure-python")
        if self.config.getoption("--host-profile"):
            options += ["--host-profile", self.config.getoption("--host-profile")]
        pinned = os.environ.get("ATEN_CPU_CAPABILITY")
        prefix = f"ATEN_CPU_CAPABILITY={pinned} " if pinned else ""
        runner = f"./scripts/tox exec -e {stage} -- pytest" if stage else "pytest"
        described = f"stage '{stage}'" if stage else "this run"
        if options or pinned:
            described += " (" + " ".join(([f"ATEN_CPU_CAPABILITY={pinned}"] if pinned else []) + options) + ")"
        terminalreporter.section("how to rerun what failed")
        terminalreporter.write_line(f"failed in {described}; each reruns on its own with:")
        for nodeid in dict.fromkeys(failed):
            terminalreporter.write_line(f"  {prefix}{runner} {' '.join(options + [shlex.quote(nodeid)])}")


class Heartbeat:
    """A line when the suite has printed nothing for a while, naming the tests still running:
    a long end-to-end test reads differently from a hung one, and a CI log never goes quiet."""
    QUIET = 45.0                                     # seconds without a line before one

    def __init__(self, reporter):
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
