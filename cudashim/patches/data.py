"""DataLoader(pin_memory_device="cuda"), and pinning where the target computes on host memory.

Where device memory is host memory (the CPU backend), ``DataLoader(pin_memory=True)`` still
hands the program pinned copies of its batches, as CUDA's pinning thread does: a sample the
dataset returns as it holds it (``batch_size=None``, a collate that returns its input) is the
program's to edit, and ``batch.is_pinned()`` is True. torch, which sees no accelerator there,
would warn and pin nothing; it is shown ``pin_memory=False`` while it builds its iterator, and
each batch is pinned (``Tensor.pin_memory``: a copy, marked pinned) as the iterator hands it out.
"""

import functools

import torch.utils.data

from .. import torch_names

TRANSLATES = (("torch.utils.data:DataLoader.__init__", "pin_memory_device"),)
ITERATOR = "torch.utils.data.dataloader._BaseDataLoaderIter"
PIN = "torch.utils.data._utils.pin_memory.pin_memory"


def install(activation):
    translate = activation.translator.for_api("DataLoader(pin_memory_device)")
    can_pin = activation.backend.can_pin_memory()
    pins_copies = not can_pin and activation.residency is not None \
        and torch_names.has(ITERATOR) and torch_names.has(PIN)

    def make_init(original):
        def __init__(self, *args, **kwargs):
            device = kwargs.get("pin_memory_device")
            if device:
                target = translate(device)
                kwargs["pin_memory_device"] = str(target) if target is not device else device
            if not can_pin and kwargs.get("pin_memory"):
                # Pinned memory needs an accelerator; the target computes on host memory.
                kwargs.pop("pin_memory_device", None)
                if not pins_copies:
                    kwargs["pin_memory"] = False
            original(self, *args, **kwargs)
        return functools.wraps(original)(__init__)

    activation.replace(torch.utils.data.DataLoader, "__init__", make_init)
    if pins_copies:
        _pin_as_batches_are_handed_out(activation, torch_names.get(ITERATOR), torch_names.get(PIN))


def _pin_as_batches_are_handed_out(activation, iterator_class, pin):

    def make_init(original):
        @functools.wraps(original)
        def __init__(self, loader, *args, **kwargs):
            pins = getattr(loader, "pin_memory", False) is True
            if pins:                       # DataLoader.__setattr__ guards other attributes only
                loader.__dict__["pin_memory"] = False
            try:
                original(self, loader, *args, **kwargs)
            finally:
                if pins:
                    loader.__dict__["pin_memory"] = True
            self._cudashim_pins = pins
        return __init__

    def make_next(original):
        @functools.wraps(original)
        def __next__(self):
            batch = original(self)
            return pin(batch) if getattr(self, "_cudashim_pins", False) else batch
        return __next__

    activation.replace(iterator_class, "__init__", make_init)
    activation.replace(iterator_class, "__next__", make_next)
