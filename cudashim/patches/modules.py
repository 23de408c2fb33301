"""nn.Module.to and to_empty. (Module.cuda calls Tensor.cuda, which is patched already.)"""

import functools

import torch

from ._arguments import to_method


def install(ctx):
    ctx.replace(torch.nn.Module, "to",
                functools.partial(to_method, translate=ctx.translate_for("Module.to")))

    translate_empty = ctx.translate_for("Module.to_empty")

    def make_to_empty(original):
        def to_empty(self, *, device, recurse=True):
            return original(self, device=translate_empty(device), recurse=recurse)
        return functools.wraps(original)(to_empty)

    ctx.replace(torch.nn.Module, "to_empty", make_to_empty)
