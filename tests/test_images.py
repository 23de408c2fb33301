"""A container image with cudashim baked in: only environment lines, every Python shimmed,
and an interpreter with a broken torch or a broken cudashim still starts."""

from conftest import python

PROBE = "import torch; print(torch.cuda.is_available(), torch.zeros(1, device='cuda').is_cuda)"


def image_environment(*options):
    result = python("-c", "from cudashim.cli import main; main()", "image-env", *options)
    assert result.returncode == 0, result.stderr
    return dict(line.split("=", 1) for line in result.stdout.strip().splitlines())


def test_the_printed_environment_alone_shims_a_fresh_interpreter():
    env = image_environment("--device-count", "3")
    assert env["CUDASHIM_ACTIVATE"] == "1" and "sitecustomize" in env["PYTHONPATH"]
    result = python("-c", PROBE + "; print(torch.cuda.device_count())", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True", "3"]
    switched_off = python("-c", PROBE, env={**env, "CUDASHIM_ACTIVATE": "0"})
    assert switched_off.returncode != 0 and "AssertionError" in switched_off.stderr


def test_a_broken_torch_is_reported_by_torch_not_by_the_hook(tmp_path):
    broken = tmp_path / "broken"
    (broken / "torch").mkdir(parents=True)
    (broken / "torch" / "__init__.py").write_text("raise ImportError('this torch build is broken')\n")
    env = image_environment()
    env["PYTHONPATH"] += f":{broken}"
    started = python("-c", "print('up')", env=env)
    assert started.returncode == 0 and started.stdout.strip() == "up" and started.stderr == ""
    failed = python("-c", "import torch", env=env)
    assert "ImportError: this torch build is broken" in failed.stderr and "cudashim" not in failed.stderr


def test_a_broken_cudashim_costs_one_warning_at_import_torch_and_nothing_else(tmp_path):
    env = image_environment()
    hook = env["PYTHONPATH"].split(":")[0]
    fake = tmp_path / "fake"
    (fake / "cudashim").mkdir(parents=True)
    (fake / "cudashim" / "__init__.py").write_text("raise RuntimeError('half-installed')\n")
    env["PYTHONPATH"] = f"{hook}:{fake}"
    untouched = python("-c", "print('up')", env=env, cwd=tmp_path)
    assert untouched.returncode == 0 and untouched.stdout.strip() == "up" and untouched.stderr == ""
    # Outside the checkout, whose own cudashim the current folder would offer first.
    result = python("-c", "import torch; print(torch.ones(1).sum().item())", env=env, cwd=tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "1.0", result.stderr
    warnings = [line for line in result.stderr.splitlines() if "Warning:" in line]
    assert len(warnings) == 1 and "cudashim is not active" in warnings[0] and "half-installed" in warnings[0]


def test_a_python_that_never_imports_torch_never_imports_cudashim():
    """Most Pythons of an image are tools: the hook waits for torch's import before it loads
    anything of cudashim's (tens of milliseconds), and a lookup of torch that finds it
    (importlib.util.find_spec, as libraries probe for torch) leaves it importable as usual."""
    env = image_environment()
    probe = ("import sys, importlib.util; before = sorted(m for m in sys.modules if 'cudashim' in m); "
             "found = importlib.util.find_spec('torch') is not None; "
             "import torch; print(before, found, 'cudashim' in sys.modules, torch.cuda.is_available(), "
             "torch.ones(1).cuda().is_cuda)")
    result = python("-c", probe, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "True", "True", "True", "True"]
    nested = python("-c", "import torch.nn as nn, torch; print(torch.cuda.is_available())", env=env)
    assert nested.returncode == 0 and nested.stdout.strip() == "True", nested.stderr


def test_a_stand_in_library_imported_before_torch_is_served():
    """An image's program sorted by isort imports ``flash_attn`` before ``torch``: the hook
    activates at that lookup too (the stand-ins that import torch themselves; the hook's own list
    is the library table's), and the stand-in answers."""
    import ast
    from pathlib import Path
    from cudashim.tables.libraries import STAND_INS
    hook = ast.parse((Path(__file__).parents[1] / "sitecustomize" / "sitecustomize.py").read_text())
    names, = (ast.literal_eval(node.value.args[0]) for node in ast.walk(hook)
              if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "NAMES")
    assert set(names) == {"torch"} | {module for stand_in in STAND_INS.values() if stand_in.imports_torch
                                      for module in stand_in.modules}
    env = image_environment()
    probe = ("import sys, flash_attn, torch; q = torch.randn(1, 4, 2, 8, device='cuda').half(); "
             "print(flash_attn.flash_attn_func(q, q, q).is_cuda, 'cudashim' in flash_attn.__file__)")
    result = python("-c", probe, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "True"]


def test_only_the_settings_given_are_pinned():
    """A default pinned in an image would stop it from following a newer cudashim's."""
    assert list(image_environment()) == ["PYTHONPATH", "CUDASHIM_ACTIVATE"]
    assert list(image_environment("--device-count", "3", "--amp-dtype", "auto")) == \
        ["PYTHONPATH", "CUDASHIM_ACTIVATE", "CUDASHIM_DEVICE_COUNT"]


def test_dockerfile_lines_quote_what_docker_would_split():
    result = python("-c", "from cudashim.cli import main; main()", "image-env", "--dockerfile",
                    "--report-json", '/runs/$RUN "x"/my report.json')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert all(line.startswith("ENV ") for line in lines) and len(lines) == 3, lines
    assert lines[2] == 'ENV CUDASHIM_REPORT_JSON="/runs/\\$RUN \\"x\\"/my report.json"', lines
