"""Builds the proxy modules that stand in for ``torch.cuda`` and its submodules.

Each classified public name is bound to its equivalent; private names fall through to the
real module, because torch's own internals reach for them (``torch.cuda._lazy_init``) and
must get the real thing.
"""

from __future__ import annotations

import contextlib
import functools
import types
from typing import Dict

from ..patching.by_caller import answer_by_caller
from ..patching.refusal import Refusal, stand_in
from ..tables import cuda_surface
from .surface import classify
from .forwarders import forwarded_names, forwarder
from .implementation import IMPLEMENTATIONS


def proxy_module(real: types.ModuleType) -> types.ModuleType:
    """A stand-in for a real ``torch.cuda`` module.

    A plain module object, not an instance of a subclass: Python reads attributes of exact
    modules on its fastest path, and every ``torch.cuda.X`` in a program pays for that.
    """
    proxy = types.ModuleType(real.__name__, real.__doc__)
    for dunder in ("__file__", "__path__", "__package__", "__spec__", "__loader__"):
        if hasattr(real, dunder):
            setattr(proxy, dunder, getattr(real, dunder))
    proxy.__dict__["_cudashim_real"] = real
    # Names not bound on the proxy fall through to the real module (PEP 562).
    proxy.__dict__["__getattr__"] = functools.partial(getattr, real)
    return proxy


def is_proxy(module) -> bool:
    return isinstance(module, types.ModuleType) and "_cudashim_real" in vars(module)


def build_proxies(real_top, activation) -> Dict[str, types.ModuleType]:
    """{module name: proxy} for ``torch.cuda`` and every public submodule below it."""
    reals = list(cuda_surface.real_submodules(real_top))
    by_name = {m.__name__: m for m in reals}
    bound = {name: cls(activation, by_name[name]).exports()
             for name, cls in IMPLEMENTATIONS.items() if name in by_name}
    forwarded = {name: forwarder(activation.backend, name) for name in forwarded_names()}
    bound[real_top.__name__] = {**forwarded, **bound[real_top.__name__]}
    proxies = {m.__name__: proxy_module(m) for m in reals}
    for real in reals:                     # packages come before their submodules
        proxy = proxies[real.__name__]
        for name in cuda_surface.public_names(real):
            owner = cuda_surface.enclosing_owner(real_top, real, name)
            if owner is not None:          # the same object as the package's: the same stand-in
                value = getattr(proxies[owner.__name__], name)
            else:
                value = _bind(real, name, real_top, proxies, bound, activation)
            setattr(proxy, name, value)
    for name, cls in IMPLEMENTATIONS.items():          # the private names programs call
        if name not in by_name:
            continue
        for private in cls.private:
            setattr(proxies[name], private, answer_by_caller(
                activation, f"{name}.{private}", getattr(by_name[name], private), bound[name][private],
                f"cudashim on {activation.backend.name}"))
    return proxies


def _bind(real, name, real_top, proxies, bound, activation):
    qualname = f"{real.__name__}.{name}"
    value = getattr(real, name, None)
    classified = classify(real_top, real, name)
    kind, way_out = classified if classified else (cuda_surface.REFUSED, cuda_surface.UNCLASSIFIED_WAY_OUT)
    if kind == cuda_surface.SAME:
        return value
    if kind == cuda_surface.SUBMODULE:
        return proxies[value.__name__]
    if kind in (cuda_surface.BACKEND, cuda_surface.SHIM):
        ours = bound[real.__name__][name]
        became = (f"{activation.backend.name} backend" if kind == cuda_surface.BACKEND
                  else f"cudashim on {activation.backend.name}")
        if callable(ours) and not isinstance(ours, type) and callable(value):
            ours = answer_by_caller(activation, qualname, value, ours, became)
        elif isinstance(ours, type) and activation.reporting:
            ours = counted_class(qualname, ours, became, activation.report)
        return ours
    answer = contextlib.nullcontext if qualname in cuda_surface.HARMLESS_CONTEXTS \
        else cuda_surface.HARMLESS_ANSWERS.get(qualname)
    return stand_in(activation, Refusal(qualname, way_out, harmless=kind == cuda_surface.HARMLESS),
                    is_class=isinstance(value, type), answer=answer, real=value)


def counted_class(api, cls, became, report):
    """``cls`` as the program sees it while the report is on: making one and ``isinstance``
    against it are counted; what it makes and what it accepts are ``cls``'s own."""
    def counting(base):
        class Counted(base):
            def __call__(self, *args, **kwargs):
                if self is not counted:                # a program's own subclass
                    return super().__call__(*args, **kwargs)
                report.count(api, became)
                return cls(*args, **kwargs)

            def __instancecheck__(self, instance):
                if self is not counted:
                    return super().__instancecheck__(instance)
                report.count(f"isinstance(..., {api})", became)
                return isinstance(instance, cls)

            def __subclasscheck__(self, subclass):
                return issubclass(subclass, cls) if self is counted else super().__subclasscheck__(subclass)
        return Counted

    try:
        counted = counting(type(cls))(cls.__name__, (cls,), {
            "__module__": cls.__module__, "__qualname__": cls.__qualname__, "__doc__": cls.__doc__})
    except TypeError:                                  # a class that cannot be subclassed
        return cls
    return counted
