"""Every private torch name cudashim reads is in ``torch_names.NAMES``, with what happens where a
torch lacks it; on the installed torch no ``REQUIRED`` one is absent. CI runs this on every torch
of the tested range (``torch_range``), so a release that moves one is found before a user does."""

import ast
import contextlib
import sys
import warnings
from pathlib import Path

import pytest

pytestmark = pytest.mark.torch_range

PACKAGE = Path(__file__).resolve().parent.parent / "cudashim"


def _private(parts):
    return any(part.startswith("_") and not (part.startswith("__") and part.endswith("__")) for part in parts)


def private_names_in_source():
    """{dotted torch name: files}: every private torch module, attribute chain and name imported
    from one that cudashim's source mentions (``torch._C._jit_set_emit_hooks``,
    ``from torch.utils._pytree import tree_leaves``)."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        aliases = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] == "torch":
                        aliases[alias.asname or "torch"] = alias.name if alias.asname else "torch"
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and \
                    node.module.split(".")[0] == "torch":
                for alias in node.names:
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    if _private(f"{node.module}.{alias.name}".split(".")):
                        found.setdefault(f"{node.module}.{alias.name}", set()).add(path.name)
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and not isinstance(getattr(node, "parent", None), ast.Attribute):
                chain, value = [], node
                while isinstance(value, ast.Attribute):
                    chain.append(value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in aliases:
                    dotted = aliases[value.id].split(".") + chain[::-1]
                    if _private(dotted):
                        found.setdefault(".".join(dotted), set()).add(path.name)
    return found


def _covered(name, names):
    """Whether ``name`` or a name it leads to or from is in the table: ``torch._C.DispatchKey``
    is covered by ``torch._C.DispatchKey.PrivateUse1``'s entry, and the reverse."""
    return any(name == entry or entry.startswith(name + ".") or name.startswith(entry + ".") for entry in names)


def asked_of_torch_names():
    """{name: files} for every name the source passes to torch_names.get or has."""
    asked = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("get", "has") and \
                    getattr(node.func.value, "id", None) == "torch_names" and node.args and \
                    isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str):
                asked.setdefault(node.args[0].value, set()).add(path.name)
    return asked


def test_every_private_torch_name_the_source_reads_is_in_the_table():
    from cudashim import torch_names

    unknown = {name: sorted(files) for name, files in asked_of_torch_names().items()
               if name not in torch_names.NAMES}
    assert not unknown, f"names asked of torch_names that are not entries: {unknown}"
    missing = {name: sorted(files) for name, files in private_names_in_source().items()
               if not _covered(name, torch_names.NAMES)}
    assert not missing, ("private torch names read outside cudashim.torch_names.NAMES (add each, "
                         f"with what happens where a torch lacks it): {missing}")


def test_this_torch_has_every_required_name_and_the_rest_are_handled():
    import torch

    from cudashim import torch_names

    rows = torch_names.table()
    lines = [f"{'present' if present else 'ABSENT':8s} {entry.absent:9s} {entry.path}  ({entry.reader})"
             for entry, present in rows]
    sys.stdout.write(f"torch {torch.__version__}: {len(rows)} names\n" + "\n".join(lines) + "\n")
    for entry, _ in rows:
        assert entry.absent in (torch_names.FALLBACK, torch_names.TURNS_OFF, torch_names.REQUIRED), entry
        assert entry.without, f"{entry.path}: say what cudashim does without it"
    unhandled = [entry.path for entry, present in rows if not present and entry.absent == torch_names.REQUIRED]
    assert not unhandled, f"torch {torch.__version__} lacks names cudashim requires: {unhandled}"


@contextlib.contextmanager
def _activated_saying_of(group):
    """cudashim active on the CPU for the block, which gets the warnings that named ``group``."""
    import cudashim

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cudashim.activate("cpu")
        try:
            yield [str(w.message) for w in caught if f"'{group}'" in str(w.message)]
        finally:
            cudashim.deactivate()


def test_a_group_whose_name_this_torch_lacks_stays_off_with_one_warning_naming_the_torch(monkeypatch):
    import torch

    import cudashim
    from cudashim import patches, torch_names

    lacking = torch_names.Name("torch._no_such_binding", "profiler", torch_names.TURNS_OFF,
                               "ProfilerActivity.CUDA stays CUDA's")
    monkeypatch.setitem(torch_names.NAMES, lacking.path, lacking)
    with _activated_saying_of("profiler") as said:
        assert said == [f"cudashim leaves the 'profiler' patches off: torch {torch.__version__} has "
                        f"no torch._no_such_binding (ProfilerActivity.CUDA stays CUDA's)"], said
        off = dict(patches.states(cudashim.activation.current_activation().settings))
        assert off["profiler"] and off["tensors"] is None
        assert torch.ones(1).cuda().is_cuda          # the rest of cudashim works


def test_a_name_not_in_the_table_is_refused_and_an_absent_one_falls_back():
    from cudashim import torch_names

    with pytest.raises(KeyError, match="not in cudashim.torch_names.NAMES"):
        torch_names.get("torch._C._not_listed")
    absent = torch_names.Name("torch._definitely_absent_name", "tests", torch_names.FALLBACK, "a default")
    torch_names.NAMES[absent.path] = absent
    try:
        assert torch_names.get(absent.path, "default") == "default"
        assert not torch_names.has(absent.path)
        with pytest.raises(AttributeError, match="has no torch._definitely_absent_name"):
            torch_names.get(absent.path)
    finally:
        del torch_names.NAMES[absent.path]


def test_a_required_name_a_newer_torch_removed_leaves_its_group_off_and_activation_alive(monkeypatch):
    """A release that drops a name read directly: the group takes back what it patched and
    stays off, with one warning naming the torch and the name; everything else still works."""
    import torch

    from cudashim.patches import profiler

    real_install = profiler.install

    def install_on_a_torch_without_the_binding(activation):
        real_install(activation)
        return torch._C._binding_a_newer_torch_removed

    monkeypatch.setattr(profiler, "install", install_on_a_torch_without_the_binding)
    real_enter = vars(torch.autograd.profiler.emit_nvtx)["__enter__"]
    with _activated_saying_of("profiler") as said:
        assert said == [f"cudashim leaves the 'profiler' patches off: torch {torch.__version__} "
                        "has no torch._C._binding_a_newer_torch_removed"], said
        assert vars(torch.autograd.profiler.emit_nvtx)["__enter__"] is real_enter   # taken back
        assert torch.ones(1).cuda().is_cuda


def test_a_bug_of_cudashims_own_is_not_taken_for_a_missing_torch_name(monkeypatch):
    import cudashim
    from cudashim.patches import profiler

    def install_with_a_bug(activation):
        return activation.no_such_attribute

    monkeypatch.setattr(profiler, "install", install_with_a_bug)
    with pytest.raises(AttributeError, match="no_such_attribute"):
        cudashim.activate("cpu")


def test_a_patch_made_on_import_that_meets_a_missing_torch_name_is_left_out_and_the_import_works():
    import torch

    import cudashim
    from cudashim.activation import current_activation

    def patch_needing_a_removed_name(module):
        return torch._C._binding_a_newer_torch_removed

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        cudashim.activate("cpu")
        try:
            current_activation().when_imported("colorsys", patch_needing_a_removed_name)
            import colorsys                              # imported by nothing before: the hook runs
            assert colorsys.rgb_to_hsv(1.0, 0.0, 0.0)[0] == 0.0
        finally:
            cudashim.deactivate()
    said = [str(w.message) for w in caught if "colorsys" in str(w.message)]
    assert said == [f"cudashim leaves its patch of colorsys out: torch {torch.__version__} has no "
                    "torch._C._binding_a_newer_torch_removed"], said
