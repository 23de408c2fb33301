"""The proxy ``torch.cuda``: in ``sys.modules``, as ``torch.cuda``, with every submodule.

Where the machine has CUDA and the target is another device (a backend named explicitly), torch's
own code still hears the truth and may start CUDA (dynamo saves CUDA's random state when CUDA is
available). Starting it (``torch._C._cuda_init``) sets names on ``sys.modules["torch.cuda"]``, which
is the proxy: ``_get_device_properties``, which the real module's functions then look up in their
own globals, and ``default_generators``, which the proxy answers for the target. So the names that
start sets go to the real module, and the proxy keeps its own.
"""

import sys

import torch

from .. import torch_names
from ..proxy.module import build_proxies

_ABSENT = object()


def install(activation):
    real = torch.cuda
    proxies = build_proxies(real, activation)
    for name, proxy in proxies.items():
        activation.registry.set_item(sys.modules, name, proxy)
    activation.registry.set_attr(torch, "cuda", proxies["torch.cuda"])
    start = torch_names.get("torch._C._cuda_init", None)
    if start is not None:
        starting = _starting_cuda_for(real, proxies["torch.cuda"], start)
        activation.registry.set_attr(torch._C, "_cuda_init", starting)


def _starting_cuda_for(real, proxy, start):
    """``torch._C._cuda_init`` with what it sets on the proxy moved to the real ``torch.cuda``."""
    def cuda_init():
        before = dict(vars(proxy))
        try:
            return start()
        finally:
            for name, value in list(vars(proxy).items()):
                kept = before.get(name, _ABSENT)
                if kept is value:
                    continue
                setattr(real, name, value)
                if kept is _ABSENT:
                    del vars(proxy)[name]          # read through to the real module, as private names are
                else:
                    vars(proxy)[name] = kept       # the proxy's own answer
    cuda_init.__name__ = cuda_init.__qualname__ = "_cuda_init"
    return cuda_init
