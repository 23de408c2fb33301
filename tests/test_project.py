"""The README's promise is what CI proves."""

import re
from pathlib import Path

from conftest import ROOT


def _readme_commands():
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    assert len(commands) == 2 and "example" in commands[0]
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    # run as written, its failure kept for the exit status (|| status=$?), not ignored
    assert any(line in (commands[1], commands[1] + " || status=$?") for line in ci), ci
    assert "./scripts/tox -e hosts || status=$?" in ci and ci[-1] == 'exit "$status"'


def test_the_example_environment_runs_the_unmodified_example_under_the_shim():
    import configparser
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    example = tox["testenv:example"]
    assert "python -m cudashim --report examples/gpt.py" in example["commands"]
    assert example["deps"].strip() == "torch==2.13.0"
    assert example["extras"].strip() == ""          # none of the test extras: only what it needs
    # the compiled parts built into the checkout its programs run in, then the fast path's line
    assert tox["testenv"]["commands_pre"].split("\n")[-1].strip() == "cudashim doctor --fast-path"
    assert [line.strip() for line in tox["testenv"]["commands_pre"].strip().split("\n")[:-1]] == [
        "python setup.py --quiet build_ext --inplace"]


def test_every_package_in_the_source_is_installed():
    """setup.py finds the packages: a new folder under cudashim/ ships with no list to keep."""
    import cudashim

    installed = Path(cudashim.__file__).parent
    assert installed != ROOT / "cudashim", "run against the installed package (tox installs it)"
    found = {init.parent.relative_to(ROOT / "cudashim") for init in (ROOT / "cudashim").rglob("__init__.py")}
    missing = sorted(str(package) for package in found if not (installed / package / "__init__.py").is_file())
    assert not missing, f"in the source, not installed: {missing}"
    assert (installed / "_sitecustomize" / "sitecustomize.py").is_file()
