"""nn.Module.to and to_empty. (Module.cuda calls Tensor.cuda, which is patched already.)"""

import functools

import torch


def install(ctx):
    real_device = torch._C.device
    translate_to = ctx.translate_for("Module.to")

    def make_to(original):
        def to(self, *args, **kwargs):
            if args:
                first = args[0]
                cls = first.__class__
                if cls is str or cls is real_device or cls is int:
                    args = (translate_to(first),) + args[1:]
            device = kwargs.get("device")
            if device is not None:
                kwargs["device"] = translate_to(device)
            return original(self, *args, **kwargs)
        return functools.wraps(original)(to)

    ctx.replace(torch.nn.Module, "to", make_to)

    translate_empty = ctx.translate_for("Module.to_empty")

    def make_to_empty(original):
        def to_empty(self, *, device, recurse=True):
            return original(self, device=translate_empty(device), recurse=recurse)
        return functools.wraps(original)(to_empty)

    ctx.replace(torch.nn.Module, "to_empty", make_to_empty)
