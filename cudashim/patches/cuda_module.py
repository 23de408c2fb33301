"""The proxy ``torch.cuda``: in ``sys.modules``, as ``torch.cuda``, with every submodule."""

import sys

import torch

from ..proxy.module import build_proxies


def install(ctx):
    proxies = build_proxies(torch.cuda, ctx.backend, ctx.settings, ctx.report)
    for name, proxy in proxies.items():
        ctx.registry.set_item(sys.modules, name, proxy)
    ctx.registry.set_attr(torch, "cuda", proxies["torch.cuda"])
