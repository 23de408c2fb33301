"""Every command and output the docs show is run here and compared, so they cannot drift.

- ``console`` blocks: each ``$`` line runs in bash, in a folder holding the fixture programs
  of ``tests/docs/``, with this interpreter's environment first on PATH; its output (stdout and
  stderr, as a terminal shows them) must match the lines below it. A line ``...`` stands for
  any number of lines, ``...`` within a line for any text. A number with a fractional part
  (``loss 0.196``) matches any printed within ``NUMBER_TOLERANCE`` of it: hosts round the same
  training differently (AVX-512 sums in another order than AVX2, a CPU with fast bfloat16 runs
  float16 autocast in it), and the docs must hold on every host. A command must exit 0.
- A block after ``<!-- docs-test: sandbox -->`` runs in a fresh copy of the checkout, with a
  virtual environment of its own that sees this environment's packages (torch) beneath its own.
  Variables after the word (``<!-- docs-test: fixtures CUDASHIM_HOST_PROFILE=slow -->``) are set
  for the block's commands: what the output shows of the host, the block names.
- ``python`` blocks run in a fresh interpreter and must exit 0.
- The ``dockerfile`` block's ENV lines are what ``cudashim image-env --dockerfile`` prints.
- The README's first block (the two commands) is what CI runs: ``test_project.py`` holds it.
"""

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from conftest import ROOT, python
from suite_run import MEASUREMENTS

DOCS = ("README.md", "CONTRIBUTING.md")
FIXTURES = ROOT / "tests" / "docs"
# <!-- docs-test: WHERE [NAME=value ...] -->: where the block runs, and variables it runs with
BLOCK = re.compile(r"(?:<!-- docs-test: (\w+)((?: \w+=\S+)*) -->\n)?```(\w*)\n(.*?)```", re.S)


def _blocks(language):
    found = []
    for doc in DOCS:
        text = (ROOT / doc).read_text()
        for match in BLOCK.finditer(text):
            if match.group(3) == language:
                line = text.count("\n", 0, match.start(3)) + 1
                marks = [pytest.mark.slow] if match.group(1) == "sandbox" else [pytest.mark.host]
                variables = dict(pair.split("=", 1) for pair in (match.group(2) or "").split())
                found.append(pytest.param(match.group(1), match.group(4), variables, id=f"{doc}:{line}",
                                          marks=marks))
    return found


def _commands(block):
    """(command, expected output lines) for each ``$`` line of a console block."""
    steps = []
    for line in block.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps and steps[-1][0].endswith("\\"):
            steps[-1] = (steps[-1][0] + "\n" + line, [])
        else:
            steps[-1][1].append(line)
    return steps


NUMBER_TOLERANCE = 0.01          # relative
# A decimal fraction standing alone: not part of a version (0.1.0) or a name (cp311).
DECIMAL = re.compile(r"(?<![\w.])-?\d+\.\d+(?![\w.])")


def _literal(text, numbers):
    """``text`` as a pattern in which each decimal fraction is a group, its value kept."""
    parts, end = [], 0
    for number in DECIMAL.finditer(text):
        parts += [re.escape(text[end:number.start()]), r"(-?\d+\.\d+)"]
        numbers.append(float(number.group()))
        end = number.end()
    return "".join(parts) + re.escape(text[end:])


def _pattern(expected_lines):
    """The pattern of the expected lines, and the numbers its groups must come close to."""
    parts, numbers = [], []
    for line in expected_lines:
        if line == "...":
            parts.append(r"(?:[^\n]*\n)*?")
        else:
            parts.append(".*?".join(_literal(piece, numbers) for piece in line.rstrip().split("...")) + r"\n")
    return re.compile("".join(parts)), numbers


def matches(expected_lines, output):
    text = "".join(line.rstrip() + "\n" for line in output.splitlines())
    pattern, numbers = _pattern(expected_lines)
    found = pattern.fullmatch(text)
    return found is not None and all(abs(float(got) - want) <= NUMBER_TOLERANCE * abs(want)
                                     for got, want in zip(found.groups(), numbers))


def _environment(bin_dir, variables):
    """The user's environment without cudashim's settings, but for where the suite keeps what
    the precision policy measures: a doctor block would time it into the user's own cache."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("CUDASHIM_", "PYTHON", "PYTEST", "COV_")) or k == MEASUREMENTS}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}", PYTHONUNBUFFERED="1", **variables)
    return env


def _sandbox(tmp_path):
    """A fresh copy of the checkout and a virtual environment that sees this one's packages
    beneath its own (torch is not downloaded again)."""
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT, checkout, ignore=shutil.ignore_patterns(
        "*.so", ".git", ".tox", "build", "dist", "*.egg-info", "__pycache__", "runs"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install",
                    "--quiet", "pip"], check=True, timeout=300)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    Path(site, "beneath.pth").write_text("".join(f"{path}\n" for path in sorted(ours)))
    return checkout, venv / "bin"


def _fixtures(tmp_path):
    folder = tmp_path / "work"
    shutil.copytree(FIXTURES, folder)
    return folder, Path(sys.executable).parent


@pytest.mark.parametrize("where, block, variables", _blocks("console"))
def test_console_block(where, block, variables, tmp_path):
    if where == "sandbox":
        cwd, bin_dir = _sandbox(tmp_path)
    else:
        assert where in (None, "fixtures"), f"unknown docs-test marker {where!r}"
        cwd, bin_dir = _fixtures(tmp_path)
    env = _environment(bin_dir, variables)
    for command, expected in _commands(block):
        result = subprocess.run(["bash", "-c", command], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, timeout=600)
        output = result.stdout
        assert result.returncode == 0, f"$ {command}\nexit status {result.returncode}\n{output}"
        assert matches(expected, output), f"$ {command}\nexpected:\n" + "\n".join(expected) + f"\ngot:\n{output}"


@pytest.mark.parametrize("where, block, variables", _blocks("python"))
def test_python_block(where, block, variables, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(block)
    result = python(str(script), cwd=tmp_path)
    assert result.returncode == 0, result.stderr


def test_the_dockerfile_sets_what_image_env_prints():
    (_, block, _), = [param.values for param in _blocks("dockerfile")]
    shown = [line.split(" ", 1)[1] for line in block.splitlines() if line.startswith("ENV ")]
    result = python("-c", "from cudashim.cli import main; main()", "image-env", "--dockerfile", cwd=FIXTURES)
    assert result.returncode == 0, result.stderr
    printed = [line.split(" ", 1)[1] for line in result.stdout.splitlines()]
    assert [line.split("=")[0] for line in shown] == [line.split("=")[0] for line in printed]
    installed_hook = "/cudashim/_sitecustomize"
    assert shown[0].endswith("site-packages" + installed_hook), shown[0]
    assert printed[0].endswith(installed_hook), printed[0]     # the installed cudashim's hook
    assert shown[1:] == printed[1:]


def test_no_command_escapes_this_test():
    """Commands are shown only in blocks this file runs; the README's first block is CI's."""
    for doc in DOCS:
        languages = [match.group(3) for match in BLOCK.finditer((ROOT / doc).read_text())]
        if doc == "README.md":
            assert languages[0] == "bash"
            languages = languages[1:]
        assert set(languages) <= {"console", "python", "dockerfile", ""}, (doc, languages)


def test_the_matcher_tells_a_difference():
    assert matches(["a ... c", "...", "z"], "a b c\nx\ny\nz\n")
    assert not matches(["a ... c", "z"], "a b c\nx\nz\n")
    assert not matches(["epoch 0: loss"], "epoch 0: loss 0.196\n")


def test_the_matcher_takes_numbers_to_their_tolerance_and_nothing_else():
    assert matches(["epoch 0: loss 0.196"], "epoch 0: loss 0.195\n")      # another host's rounding
    assert matches(["loss 10.596 ... 9.217"], "loss 10.595 then 9.216\n")
    assert not matches(["epoch 0: loss 0.196"], "epoch 0: loss 0.199\n")  # 1.5%: another result
    assert not matches(["epoch 0: loss 0.196"], "epoch 1: loss 0.196\n")  # whole numbers are text
    assert not matches(["cudashim-0.1.0.tar.gz"], "cudashim-0.1.1.tar.gz\n")   # versions are text
    assert not matches(["1.5x"], "1.5y\n")


def test_the_docs_commands_run_without_cudashims_settings_but_keep_the_suites_measurements(monkeypatch, tmp_path):
    """A block runs as a user types it: no CUDASHIM_* setting of the suite's reaches it, but
    what it measures of this CPU (cudashim doctor times the float16 tables) goes where the suite
    keeps it, never into the user's ~/.cache/cudashim."""
    monkeypatch.setenv(MEASUREMENTS, str(tmp_path))
    monkeypatch.setenv("CUDASHIM_HOST_PROFILE", "slow")
    env = _environment(tmp_path / "bin", {})
    assert env[MEASUREMENTS] == str(tmp_path) and "CUDASHIM_HOST_PROFILE" not in env
