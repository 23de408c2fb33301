"""The README's promise is what CI proves."""

import re

from conftest import ROOT


def _readme_commands():
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.S).group(1)
    return [line.split("#")[0].strip() for line in block.strip().splitlines()]


def test_readme_opens_with_two_commands_and_ci_runs_the_test_one():
    commands = _readme_commands()
    assert len(commands) == 2 and "example" in commands[0]
    ci = (ROOT / ".ci" / "run").read_text()
    assert commands[1] in ci.splitlines()


def test_the_example_environment_runs_the_unmodified_example_under_the_shim():
    import configparser
    tox = configparser.ConfigParser(interpolation=None)
    tox.read(ROOT / "tox.ini")
    example = tox["testenv:example"]
    assert "python -m cudashim --report examples/gpt.py" in example["commands"]
    assert example["deps"].strip() == "torch==2.13.0"
    assert example["extras"].strip() == ""          # none of the test extras: only what it needs
    assert tox["testenv"]["commands_pre"].strip() == "cudashim doctor --fast-path"


def test_every_package_in_the_source_is_installed():
    import tomllib

    declared = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(init.parent.relative_to(ROOT).parts)
             for init in (ROOT / "cudashim").rglob("__init__.py")}
    assert found <= declared, f"not in pyproject.toml's packages: {sorted(found - declared)}"
