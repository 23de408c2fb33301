"""How the suite runs (tests/suite_run.py): a failure says its stage and the command that reruns
it, tests start longest first by the last run's durations, and the builds go to the suite's cache."""

import os
import subprocess
import sys

from conftest import ROOT

TESTS = '''
import os, sys, time

def test_quick():
    pass

def test_slow():
    time.sleep(0.5)

def test_fails():
    assert os.environ["TORCH_EXTENSIONS_DIR"].startswith(os.environ["XDG_CACHE_HOME"]), "no cache"
    # one folder for each torch, Python and machine, whichever environment or checkout runs
    builds = os.path.dirname(os.environ["TORCH_EXTENSIONS_DIR"])
    assert os.path.basename(os.environ["TORCH_EXTENSIONS_DIR"]) == "extensions", builds
    assert os.path.basename(builds).endswith("-py%d%d-%s" % (*sys.version_info[:2], os.uname().machine)), builds
    assert False, "as asked"
'''


def _pytest(folder, *options, env=None):
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("CUDASHIM_", "PYTEST_", "TOX_", "TORCH_EXTENSIONS", "TORCHINDUCTOR", "ATEN_"))}
    environ.update(PYTHONPATH=str(ROOT / "tests"), XDG_CACHE_HOME=str(folder / "cache"), **(env or {}))
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "suite_run", "-v", "-p", "no:cacheprovider",
                           *options, "test_it.py"], cwd=folder, env=environ, capture_output=True, text=True,
                          timeout=120)


def test_a_failure_names_its_stage_and_the_command_that_reruns_it(tmp_path):
    (tmp_path / "test_it.py").write_text(TESTS)
    result = _pytest(tmp_path, "--host-profile", "slow", env={"TOX_ENV_NAME": "hosts", "ATEN_CPU_CAPABILITY": "avx2"})
    assert result.returncode == 1, result.stdout + result.stderr
    assert "AssertionError: as asked" in result.stdout             # the cache folder was the suite's
    assert "failed in stage 'hosts' (ATEN_CPU_CAPABILITY=avx2 --host-profile slow); each reruns on its " \
           "own with:\n  ATEN_CPU_CAPABILITY=avx2 ./scripts/tox exec -e hosts -- pytest --host-profile slow " \
           "test_it.py::test_fails\n" in result.stdout
    assert "test_quick" not in result.stdout.split("how to rerun what failed")[1]


def test_tests_start_longest_first_by_the_last_run_of_the_same_pass(tmp_path):
    (tmp_path / "test_it.py").write_text(TESTS)

    def order(*options):
        result = _pytest(tmp_path, *options)
        return [line.split("::")[1].split()[0] for line in result.stdout.splitlines()
                if line.startswith("test_it.py::") and (" PASSED" in line or " FAILED" in line)]

    assert order() == ["test_quick", "test_slow", "test_fails"]            # nothing measured: as written
    assert order()[0] == "test_slow"                                       # measured: the longest first
    assert order("--pure-python") == ["test_quick", "test_slow", "test_fails"]   # another pass: its own


def test_deepspeeds_builds_are_kept_by_its_version_and_place_and_survive_a_new_installation(
        tmp_path, monkeypatch):
    """An environment with DeepSpeed files its op builds under DeepSpeed's version and the
    environment's place, and dates DeepSpeed's sources once, so that ninja finds the builds of
    the environment made there before up to date; one without DeepSpeed shares one folder."""
    import importlib.util
    import suite_run
    site = tmp_path / "site"
    sources = site / "deepspeed" / "ops" / "csrc" / "adam"
    sources.mkdir(parents=True)
    (site / "deepspeed" / "__init__.py").write_text("")
    (sources / "cpu_adam.cpp").write_text("// just installed\n")
    (site / "deepspeed-9.8.7.dist-info").mkdir()
    (site / "deepspeed-9.8.7.dist-info" / "METADATA").write_text("Name: deepspeed\nVersion: 9.8.7\n")
    if importlib.util.find_spec("deepspeed") is None:               # this environment has none
        assert suite_run._extensions_folder() == "extensions"
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()
    folder = suite_run._extensions_folder()
    assert folder.startswith("extensions-deepspeed-9.8.7-") and len(folder) == len("extensions-deepspeed-9.8.7-") + 12
    assert (sources / "cpu_adam.cpp").stat().st_mtime == suite_run.SETTLED_SOURCES
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "elsewhere"))
    assert suite_run._extensions_folder() != folder                  # another place, other builds
