"""Patch groups: declarations applied by one rewriter, switched off by a setting, bounded by
torch version, listed by doctor."""

import pytest
import torch

from conftest import installed_distribution, python

from cudashim import _settings, patches
from cudashim.patching import rewriter


def declarations():
    """(group, declaration) for every device-argument patch the groups declare."""
    return [(name, declaration) for name in patches.GROUPS
            for declaration in getattr(patches.group_module(name), "REWRITES", ())]


def test_every_declaration_names_a_target_this_torch_has_and_activation_patches_it(shim):
    import importlib
    import wrapt
    registry = shim.activation.current_activation().registry
    targets = {declaration.target for _, declaration in declarations()}
    assert {"torch:zeros", "torch:Tensor.to", "torch.nn:Module.to"} <= targets
    for group, declaration in declarations():
        module = importlib.import_module(declaration.module)   # deferred ones are patched on import
        owner, name, _ = wrapt.resolve_path(module, declaration.path)
        assert (id(owner), name) in {(id(p.owner), p.name) for p in registry}, \
            f"{group}: {declaration.target} is not patched"
        assert registry.original(owner, name) is not vars(owner).get(name)


def test_the_rewriter_counts_each_translated_call_under_the_api_name():
    import cudashim
    cudashim.activate("cpu", report=True)
    report = cudashim.activation.current_activation().report
    torch.zeros(2, device="cuda")
    torch.zeros(2)                                     # untranslated: not counted
    t = torch.ones(2).to("cuda:0")
    t.new_zeros(3, device="cuda")
    torch.amp.GradScaler()                             # the missing device means "cuda"
    assert report.entries["torch.zeros"]["calls"] == 1
    assert report.entries["torch.Tensor.to"]["calls"] == 1
    assert report.entries["torch.Tensor.new_zeros"]["became"] == "cpu"
    assert report.entries["torch.amp.GradScaler"]["became"] == "cpu"
    cudashim.deactivate()


def test_positions_come_from_the_signature_where_there_is_one():
    import torch.distributed
    from torch.nn.parallel import DistributedDataParallel
    assert rewriter._signature_position(DistributedDataParallel.__init__, "device_ids") == 2
    assert rewriter._signature_position(torch.distributed.barrier, "device_ids") == 2
    assert rewriter._signature_position(torch.amp.custom_fwd, "device_type") is None   # keyword-only
    assert rewriter._signature_position(torch.zeros, "device") is None                 # a C function


def test_a_positional_device_is_told_apart_from_a_dtype(shim):
    t = torch.ones(2)
    assert t.to(torch.float16).dtype == torch.float16
    assert t.to(0).is_cuda and t.to("cuda", torch.float64).dtype == torch.float64
    assert torch.nn.Linear(2, 2).to(0, torch.float64).weight.dtype == torch.float64


@pytest.mark.parametrize("how", ["keyword", "environment"])
def test_a_disabled_group_patches_nothing_and_the_others_still_work(how, monkeypatch):
    import cudashim
    original_init = torch.profiler.profile.__init__
    if how == "keyword":
        cudashim.activate("cpu", disable="profiler,compiled")
    else:
        monkeypatch.setenv("CUDASHIM_DISABLE", "profiler, compiled")
        cudashim.activate("cpu")
    assert torch.profiler.profile.__init__ is original_init
    assert torch.zeros(1, device="cuda").is_cuda
    cudashim.deactivate()


def test_an_unknown_group_name_lists_the_valid_ones():
    with pytest.raises(ValueError, match="unknown patch group.s. teapot; valid: torchscript, environment, frameworks, version_gates, device_objects, residency, host_memory, factories, tensors, legacy_types, modules, torch_accelerator, amp"):
        _settings.load({"CUDASHIM_DISABLE": "amp,teapot"})
    assert _settings.load({}, disable=["amp"]).to_environ()["CUDASHIM_DISABLE"] == "amp"


def test_a_group_outside_its_torch_versions_stays_off_with_one_warning(monkeypatch):
    import cudashim
    from cudashim.errors import CudashimWarning
    monkeypatch.setattr(patches.group_module("profiler"), "SUPPORTED_TORCH", ("99.0", None), raising=False)
    monkeypatch.setattr(patches.group_module("data"), "SUPPORTED_TORCH", ("2.0", "2.1"), raising=False)
    original_init = torch.profiler.profile.__init__
    with pytest.warns(CudashimWarning, match=r"leaves the 'profiler' patches off: torch .* \(>=99.0\)"):
        cudashim.activate("cpu")
    assert torch.profiler.profile.__init__ is original_init
    states = dict(patches.states(cudashim.activation.current_activation().settings))
    assert states["data"].endswith("(>=2.0,<2.1)") and states["amp"] is None
    cudashim.deactivate()


def test_doctor_lists_the_groups_and_which_are_on():
    result = python("-c", "from cudashim.cli import main; main()", "doctor", "--disable", "flags")
    assert result.returncode == 0, result.stdout + result.stderr
    lines = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("  ")}
    assert "off: disabled by the setting" in lines["flags"]
    for name in patches.GROUPS:
        assert name in lines, name
    assert lines["amp"].split()[1] == "on"
    for name in patches.GROUPS:               # each description whole, as a terminal shows it
        description = lines[name].split("  (", 1)[1]
        assert description.endswith(".)") and "``" not in description, lines[name]


def test_the_launcher_option_reaches_the_program_and_its_children():
    code = ("import os, subprocess, sys, torch\n"
            "import cudashim\n"
            "patched = torch.profiler.profile.__init__ is not cudashim.get_original(torch.profiler.profile, '__init__')\n"
            "child = subprocess.run([sys.executable, '-c', 'import torch, cudashim; "
            "print(sorted(cudashim.activation.current_activation().settings.disable))'], "
            "capture_output=True, text=True).stdout.strip()\n"
            "print(patched, torch.zeros(1, device='cuda').is_cuda, os.environ['CUDASHIM_DISABLE'], child)\n")
    result = python("-m", "cudashim", "--disable", "profiler", "-c", code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True", "profiler", "['profiler']"]


def test_a_package_adds_a_patch_group_through_an_entry_point(tmp_path):
    """A package registers ``cudashim.patch_groups``: activation applies it after the built-in
    groups, deactivation undoes it, ``--disable`` turns it off, and doctor lists it."""
    (tmp_path / "answer_group.py").write_text(
        '"""The program\'s own library answers 42 under cudashim."""\n'
        "import answer_library\n"
        "def install(activation):\n"
        "    activation.replace(answer_library, 'answer', lambda original: lambda: 42)\n")
    (tmp_path / "answer_library.py").write_text("def answer():\n    return 0\n")
    installed_distribution(tmp_path, "answer-group", "[cudashim.patch_groups]\nanswer = answer_group\n")
    code = ("import sys, torch, cudashim, answer_library\n"
            "from cudashim import patches\n"
            "cudashim.activate('cpu', disable=sys.argv[1:])\n"
            "print(patches.names()[-1], answer_library.answer())\n"
            "cudashim.deactivate()\n"
            "print(answer_library.answer())\n")
    env = {"PYTHONPATH": str(tmp_path)}
    applied = python("-c", code, env=env)
    assert applied.returncode == 0, applied.stderr
    assert applied.stdout.split() == ["answer", "42", "0"]
    disabled = python("-c", code, "answer", env=env)
    assert disabled.returncode == 0, disabled.stderr
    assert disabled.stdout.split() == ["answer", "0", "0"]
    doctor = python("-c", "from cudashim.cli import main; main()", "doctor", "--disable", "answer", env=env)
    assert doctor.returncode == 0, doctor.stderr
    line = next(line for line in doctor.stdout.splitlines() if line.split()[:1] == ["answer"])
    assert "off: disabled by the setting" in line and "answers 42 under cudashim" in line
