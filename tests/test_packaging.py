"""What a newcomer installs: the wheel and sdist as `python -m build` makes them, with and
without a C compiler, at both ends of the build requirement's bounds, and the bootstrap
behind the README's two commands, on Pythons that refuse installs outside a virtual
environment (PEP 668) and on ones without the venv module's pip."""

import os
import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from pathlib import Path

import pytest

from conftest import ROOT, python

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
SETUPTOOLS_BOUNDS = re.fullmatch(r"setuptools>=([\d.]+),<([\d.]+)", PYPROJECT["build-system"]["requires"][0])


def _fresh_source(tmp_path, name):
    """The sources alone, as a fresh clone has them."""
    source = tmp_path / name
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        "*.so", ".git", ".tox", "build", "dist", "*.egg-info", "__pycache__", "runs"))
    return source


def _compiled_parts(wheel):
    return sorted(n for n in zipfile.ZipFile(wheel).namelist() if n.endswith((".so", ".pyd")))


def test_the_metadata_uses_current_standards():
    assert PYPROJECT["project"]["license"] == "Apache-2.0"        # an SPDX expression
    assert SETUPTOOLS_BOUNDS, PYPROJECT["build-system"]["requires"]
    extras = PYPROJECT["project"]["optional-dependencies"]
    assert {"deepspeed", "megatron", "xpu", "npu", "hpu", "test"} <= set(extras)


@pytest.mark.slow
def test_python_m_build_makes_an_sdist_and_a_wheel_with_the_compiled_parts(tmp_path):
    """The newest setuptools the bounds allow (build's isolated environment picks it): no
    deprecation on the way, the sdist carries the C sources, the wheel built from it both
    extensions and the SPDX license."""
    source = _fresh_source(tmp_path, "source")
    result = python("-m", "build", "--outdir", str(tmp_path / "dist"), str(source), timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Deprecat" not in result.stdout + result.stderr, (result.stdout + result.stderr)[-3000:]
    sdist, = (tmp_path / "dist").glob("cudashim-*.tar.gz")
    names = tarfile.open(sdist).getnames()
    assert any(n.endswith("cudashim/_speedups.c") for n in names)
    assert any(n.endswith("cudashim/kernels/_native.c") for n in names)
    assert any(n.endswith("cudashim/kernels/_native_loops.h") for n in names)
    assert any(n.endswith("cudashim/_speedups_gaps.c") for n in names)
    wheel, = (tmp_path / "dist").glob("cudashim-*.whl")
    assert len(_compiled_parts(wheel)) == 2, _compiled_parts(wheel)
    assert "cudashim/testdevice/device.cpp" in zipfile.ZipFile(wheel).namelist()   # built where used
    metadata = zipfile.ZipFile(wheel).read(f"cudashim-{PYPROJECT['project']['version']}.dist-info/METADATA")
    assert b"License-Expression: Apache-2.0" in metadata


@pytest.mark.slow
def test_without_a_compiler_the_oldest_setuptools_builds_a_wheel_that_says_so(tmp_path):
    """CC points nowhere and setuptools is the lowest the bounds allow: the wheel builds
    without the extensions, installs, and one line says what the fast path's absence costs."""
    source = _fresh_source(tmp_path, "source")
    constraint = tmp_path / "constraints.txt"
    constraint.write_text(f"setuptools=={SETUPTOOLS_BOUNDS.group(1)}\n")
    result = python("-m", "pip", "wheel", "--no-deps", "-w", str(tmp_path / "dist"), str(source), "-v",
                    env={"CC": "/nonexistent/cc", "PIP_BUILD_CONSTRAINT": str(constraint),   # pip >= 25.3
                         "PIP_CONSTRAINT": str(constraint)}, timeout=600)                   # before
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"setuptools-{SETUPTOOLS_BOUNDS.group(1)}" in result.stdout + result.stderr
    wheel, = (tmp_path / "dist").glob("cudashim-*.whl")
    assert _compiled_parts(wheel) == []
    installed = tmp_path / "installed"
    result = python("-m", "pip", "install", "--no-deps", "--target", str(installed), str(wheel))
    assert result.returncode == 0, result.stderr[-3000:]
    line = python("-c", "from cudashim.cli import main; main()", "doctor", "--fast-path",
                  env={"PYTHONPATH": str(installed)}, cwd=tmp_path)
    assert line.returncode == 0, line.stderr
    assert line.stdout.startswith("compiled fast path: not built (no C compiler"), line.stdout
    assert "µs per wrapped call" in line.stdout and len(line.stdout.splitlines()) == 1


# --- the bootstrap behind the README's two commands ------------------------------------------

def _bootstrap(tmp_path, python_command):
    """scripts/tox --version in a copy of the checkout, with PYTHON naming ``python_command``."""
    checkout = _fresh_source(tmp_path, "checkout")
    return subprocess.run([str(checkout / "scripts" / "tox"), "--version"], capture_output=True,
                          text=True, timeout=600, env={**os.environ, "PYTHON": python_command})


def _externally_managed_python():
    for candidate in ("/usr/bin/python3", shutil.which("python3") or ""):
        if not candidate:
            continue
        probe = subprocess.run([candidate, "-c", "import sysconfig; print(sysconfig.get_paths()['stdlib'])"],
                               capture_output=True, text=True)
        if probe.returncode == 0 and (Path(probe.stdout.strip()) / "EXTERNALLY-MANAGED").exists():
            return candidate
    return None


@pytest.mark.slow
def test_the_bootstrap_runs_tox_where_python_refuses_installs(tmp_path):
    managed = _externally_managed_python()
    if managed is None:
        pytest.skip("no Python here refuses installs outside a virtual environment (PEP 668)")
    refused = subprocess.run([managed, "-m", "pip", "install", "--dry-run", "tox"], capture_output=True, text=True)
    assert refused.returncode != 0 and "externally-managed-environment" in refused.stderr
    result = _bootstrap(tmp_path, managed)
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.match(r"\d+\.\d+", result.stdout.splitlines()[-1]), result.stdout
    assert "installing tox into .tox/tox-bootstrap (once)" in result.stdout


@pytest.mark.slow
def test_the_bootstrap_runs_tox_where_venv_has_no_pip(tmp_path):
    """Debian's python3 without python3-venv: `-m venv` fails for want of ensurepip; the
    bootstrap makes the environment without pip and installs tox with the Python's own pip."""
    fake = tmp_path / "python3-without-ensurepip"
    fake.write_text("#!/bin/sh\n"
                    'if [ "$1 $2" = "-m venv" ] && [ "$3" != "--without-pip" ]; then\n'
                    '    echo "The virtual environment was not created successfully because ensurepip is not available." >&2\n'
                    "    exit 1\n"
                    "fi\n"
                    f'exec {sys.executable} "$@"\n')
    fake.chmod(0o755)
    result = _bootstrap(tmp_path, str(fake))
    assert result.returncode == 0, result.stdout + result.stderr
    assert re.match(r"\d+\.\d+", result.stdout.splitlines()[-1]), result.stdout


def test_the_bootstrap_says_what_to_install_where_it_cannot_make_an_environment(tmp_path):
    fake = tmp_path / "python3-without-venv"
    fake.write_text("#!/bin/sh\nexit 1\n")
    fake.chmod(0o755)
    result = _bootstrap(tmp_path, str(fake))
    assert result.returncode == 1
    assert "apt install python3-venv" in result.stderr and result.stderr.count("\n") == 1, result.stderr
