"""Nothing unclassified: every public name of the real torch.cuda (and submodules)."""

import types

import torch

from cudashim.proxy.surface import classify
from cudashim.tables import cuda_surface
from cudashim.proxy.forwarders import forwarded_names
from cudashim.proxy.implementation import IMPLEMENTATIONS


def test_every_public_name_is_classified():
    missing = []
    for module in cuda_surface.real_submodules(torch.cuda):
        for name in cuda_surface.public_names(module):
            if classify(torch.cuda, module, name) is None:
                missing.append(f"{module.__name__}.{name}")
    assert missing == [], f"classify these in cudashim/tables/cuda_surface.py: {missing}"


def _sources():
    """{module name: {name: where cudashim declares it}} over the table, the
    implementations and the Backend's torch.cuda methods."""
    sources = {}
    for module_name, names in cuda_surface.SURFACE.items():
        for name in names:
            sources.setdefault(module_name, {}).setdefault(name, []).append("surface table")
    for module_name, cls in IMPLEMENTATIONS.items():
        for name in cls.implements():
            sources.setdefault(module_name, {}).setdefault(name, []).append(cls.__name__)
    for name in forwarded_names():
        sources.setdefault("torch.cuda", {}).setdefault(name, []).append("Backend")
    return sources


def test_names_declared_by_cudashim_exist_in_torch():
    """A name torch removed should leave the table, the implementation or the Backend too,
    unless it is one the table keeps for the older releases that have it."""
    reals = {m.__name__: m for m in cuda_surface.real_submodules(torch.cuda)}
    stale = [f"{module_name}.{name} ({', '.join(where)})"
             for module_name, names in _sources().items() for name, where in names.items()
             if (module_name not in reals or not hasattr(reals[module_name], name))
             and f"{module_name}.{name}" not in cuda_surface.OLDER_TORCH_ONLY]
    assert stale == []
    older = [name for name in cuda_surface.OLDER_TORCH_ONLY
             if name.rpartition(".")[2] not in cuda_surface.SURFACE.get(name.rpartition(".")[0], {})]
    assert older == [], "every name kept for older releases is in the table"


def test_each_name_has_one_source():
    """A torch.cuda name is forwarded, implemented, or given a reason: never two of them."""
    twice = [f"{module_name}.{name}: {', '.join(where)}"
             for module_name, names in _sources().items() for name, where in names.items()
             if len(where) > 1]
    assert twice == []
    assert {"synchronize", "memory_allocated", "Stream"} <= set(forwarded_names())
    assert {"is_available", "set_device", "FloatTensor"} <= set(IMPLEMENTATIONS["torch.cuda"].implements())


def test_every_name_resolves_on_the_proxy(shim):
    real_top = shim.get_original(torch, "cuda")
    import sys
    for module in cuda_surface.real_submodules(real_top):
        proxy = sys.modules[module.__name__]
        assert proxy is not module
        for name in cuda_surface.public_names(module):
            value = getattr(proxy, name)
            kind, _ = classify(real_top, module, name)
            if kind in (cuda_surface.BACKEND, cuda_surface.SHIM) and callable(value):
                assert value is not getattr(module, name), f"{module.__name__}.{name} not replaced"
            if kind == cuda_surface.SUBMODULE:
                assert isinstance(value, types.ModuleType) and value is sys.modules[value.__name__]
