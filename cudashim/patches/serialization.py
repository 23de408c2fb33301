"""torch.load: storages saved on ``cuda:N`` load onto the target, in every map_location form.

Saving needs nothing: tensors live on the target, so files carry the target's tags and load
with plain PyTorch anywhere.
"""

import functools

import torch
import torch.serialization


def install(ctx):
    translate = ctx.translate_for("torch.load")
    default_restore = torch.serialization.default_restore_location

    def restore(storage, location):
        # location is a tag such as "cuda:1"; parse it, never match it as a substring
        target = translate(location)
        return default_restore(storage, location if target is location else str(target))

    def map_location_for(map_location):
        if map_location is None:
            return restore
        if isinstance(map_location, (str, int, torch._C.device)):
            target = translate(map_location)
            return target if target is not map_location else map_location
        if isinstance(map_location, dict):
            def mapped(storage, location):
                return restore(storage, map_location.get(location, location))
            return mapped
        if callable(map_location):
            def called(storage, location):
                result = map_location(storage, location)
                return restore(storage, location) if result is None else result
            return called
        return map_location

    def make_load(original):
        def load(f, map_location=None, *args, **kwargs):
            return original(f, map_location_for(map_location), *args, **kwargs)
        return functools.wraps(original)(load)

    ctx.replace(torch, "load", make_load)
