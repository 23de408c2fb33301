"""The proxy ``torch.cuda``: in ``sys.modules``, as ``torch.cuda``, with every submodule."""

import sys

import torch

from ..proxy.module import build_proxies


def install(activation):
    proxies = build_proxies(torch.cuda, activation)
    for name, proxy in proxies.items():
        activation.registry.set_item(sys.modules, name, proxy)
    activation.registry.set_attr(torch, "cuda", proxies["torch.cuda"])
