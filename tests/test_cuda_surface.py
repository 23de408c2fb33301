"""Nothing unclassified: every public name of the real torch.cuda (and submodules)."""

import types

import torch

from cudashim.proxy import surface


def test_every_public_name_is_classified():
    missing = []
    for module in surface.real_submodules(torch.cuda):
        for name in surface.public_names(module):
            if surface.classify(torch.cuda, module, name) is None:
                missing.append(f"{module.__name__}.{name}")
    assert missing == [], f"classify these in cudashim/proxy/surface.py: {missing}"


def test_table_names_exist_in_torch():
    """A name torch removed should leave the table too."""
    stale = []
    reals = {m.__name__: m for m in surface.real_submodules(torch.cuda)}
    for module_name, names in surface.SURFACE.items():
        module = reals.get(module_name)
        for name in names:
            if module is None or not hasattr(module, name):
                stale.append(f"{module_name}.{name}")
    assert stale == []


def test_every_name_resolves_on_the_proxy(shim):
    real_top = shim._state.real(torch, "cuda")
    import sys
    for module in surface.real_submodules(real_top):
        proxy = sys.modules[module.__name__]
        assert proxy is not module
        for name in surface.public_names(module):
            value = getattr(proxy, name)
            kind, _ = surface.classify(real_top, module, name)
            if kind in (surface.BACKEND, surface.SHIM) and callable(value):
                assert value is not getattr(module, name), f"{module.__name__}.{name} not replaced"
            if kind == surface.SUBMODULE:
                assert isinstance(value, types.ModuleType) and value is sys.modules[value.__name__]
