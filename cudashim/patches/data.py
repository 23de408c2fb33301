"""DataLoader(pin_memory_device="cuda"), and pinning where the target computes on host memory."""

import functools

import torch.utils.data

TRANSLATES = (("torch.utils.data:DataLoader.__init__", "pin_memory_device"),)


def install(activation):
    translate = activation.translator.for_api("DataLoader(pin_memory_device)")
    can_pin = activation.backend.can_pin_memory()

    def make_init(original):
        def __init__(self, *args, **kwargs):
            device = kwargs.get("pin_memory_device")
            if device:
                target = translate(device)
                kwargs["pin_memory_device"] = str(target) if target is not device else device
            if not can_pin and kwargs.get("pin_memory"):
                # Pinned memory needs an accelerator; the target computes on host memory.
                kwargs["pin_memory"] = False
                kwargs.pop("pin_memory_device", None)
            original(self, *args, **kwargs)
        return functools.wraps(original)(__init__)

    activation.replace(torch.utils.data.DataLoader, "__init__", make_init)
