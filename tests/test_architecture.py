"""The house's floors: imports run down, from the commands to the tables, but for one.

Data flows up: tables and primitives at the bottom, then backends (and the kernels and
devices they serve), then the patching vocabulary and the patch groups, then the activation
that applies them, then the commands. A module imports from its own floor or below; the one
import that runs back up is listed with its reason.
"""

import ast

from conftest import ROOT

FLOORS = (
    ("tables and primitives", {"tables", "errors", "cuda_build", "legacy_types", "registry", "report",
                               "callers", "plugins", "job_layout", "torch_names", "torch_range"}),
    ("backends", {"backends", "kernels", "parallel", "graphs", "testdevice", "translation", "precision",
                  "residency", "device_memory", "host_memory"}),
    ("patch groups", {"patching", "proxy", "substitutes", "patches"}),
    ("activation", {"_settings", "activation", "autograd_exit", "speedups", "__init__"}),
    ("commands", {"cli", "doctor", "launcher", "auto", "__main__", "scan"}),
)
# (importing module, imported module): why it runs up
RUNS_UP = {
    ("cudashim.kernels.native", "cudashim._settings"):
        "the host kernels are a library too: used without an activation, they read the "
        "pure_python setting from the environment as an activation would",
}


def _floor(module: str) -> int:
    top = (module.split(".")[1:] or ["__init__"])[0]
    for index, (_, members) in enumerate(FLOORS):
        if top in members:
            return index
    raise AssertionError(f"{module} is on no floor: add its top-level name to FLOORS")


def _module_named(base: str, name: str) -> str:
    """``base.name`` where that is a module, else ``base`` (``from . import __version__``)."""
    path = ROOT.joinpath(*f"{base}.{name}".split("."))
    return f"{base}.{name}" if path.with_suffix(".py").is_file() or path.is_dir() else base


def _imports():
    """(module, imported cudashim module, line) for every import, at any depth of the code."""
    for path in sorted((ROOT / "cudashim").rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join(anchor + ([node.module] if node.module else []))
                names = [_module_named(base, alias.name) for alias in node.names]
                yield from ((module, name, node.lineno) for name in names if name.startswith("cudashim"))
            elif isinstance(node, ast.Import):
                yield from ((module, alias.name, node.lineno) for alias in node.names
                            if alias.name.startswith("cudashim"))


def test_every_import_runs_down_the_floors_but_the_one_named():
    up = {(module, imported): line for module, imported, line in _imports()
          if _floor(imported) > _floor(module)}
    unexplained = [f"{module}:{line} imports {imported} ({FLOORS[_floor(module)][0]} -> "
                   f"{FLOORS[_floor(imported)][0]})" for (module, imported), line in sorted(up.items())
                   if (module, imported) not in RUNS_UP]
    assert not unexplained, "imports that run back up:\n" + "\n".join(unexplained)
    assert set(RUNS_UP) <= set(up), "a listed exception no longer exists: take it out of RUNS_UP"
    assert len(RUNS_UP) <= 1


def test_the_check_sees_imports_inside_functions_and_every_module_has_a_floor():
    imports = list(_imports())
    # activation imports the patch groups inside _install, as it applies them
    assert any(module == "cudashim.activation" and imported == "cudashim.patches"
               for module, imported, _ in imports)
    for module, imported, _ in imports:
        _floor(module), _floor(imported)
