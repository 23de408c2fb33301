"""The target's device module answers the ``torch.cuda`` names it lacks.

Programs dispatch on a device's type: ``getattr(torch, device.type)`` or
``torch.get_device_module(device)``, then ``is_bf16_supported()``, ``empty_cache()``,
``manual_seed_all()``. Their devices are the target's, so they reach ``torch.cpu`` (or
``torch.npu``, ``torch.xpu``), which lacks most of that API. While cudashim is active, the
target's module is given every public ``torch.cuda`` name it does not have, answered as the
proxy ``torch.cuda`` answers it; nothing it has is replaced, and deactivation takes the
additions away again.

The additions answer everyone alike. Unlike ``torch.cuda``'s names, whose callers from torch
hear the real CUDA runtime, a name asked of the target's module is about the target, whoever
asks (torch's ``fork_rng`` asks ``torch.cpu.get_rng_state`` for the program's devices).

One name the CPU's module has answers otherwise than CUDA's: its stand-in stream's
``record_event()`` returns None, where CUDA's records an event and returns it. FSDP2 takes its
streams from the mesh's device module, so a CUDA program's HSDP reaches ``torch.cpu.Stream``;
torch 2.7 then asserts the all-reduce's event is not None and stops the program at its first
backward (torch 2.13 checks for the CPU itself). On the CPU target the stand-in
records and returns an event of ``torch.cpu.Event``, whose waits are met at once, as every wait
on a host stream is.
"""

import logging
import sys
import types

import torch

from ..backends.base import vendor_lookup
from ..proxy.module import is_proxy

log = logging.getLogger(__name__)


def install(activation):
    proxy = sys.modules.get("torch.cuda")
    if not is_proxy(proxy):
        log.debug("cudashim: torch.cuda is not the proxy; the target's device module is left as is")
        return
    target = target_module(activation.backend)
    if target is None or target is proxy:
        return
    for name, value in vars(proxy).items():
        if name.startswith("_") or answers(target, name):
            continue
        activation.registry.add_attr(target, name, getattr(value, "cudashim_answer", value))
    if target is getattr(torch, "cpu", None):
        _host_streams_record_events(activation, target)


def _host_streams_record_events(activation, cpu):
    """``torch.cpu.Stream.record_event`` returns the event it records, as CUDA's does (above),
    where torch's returns None."""
    stream, event_class = getattr(cpu, "Stream", None), getattr(cpu, "Event", None)
    if not isinstance(stream, type) or not isinstance(event_class, type) \
            or not callable(vars(stream).get("record_event")) or stream().record_event() is not None:
        return

    def make(original):
        def record_event(self, event=None):
            event = event_class() if event is None else event
            event.record(self)
            return event
        record_event.__doc__ = original.__doc__
        return record_event
    activation.replace(stream, "record_event", make)


def answers(module, name: str) -> bool:
    """Whether the module has ``name``: an attribute, or a name its own ``__getattr__`` makes
    (torchvulkan makes ``default_generators`` there, its devices' generators)."""
    return name in vars(module) or vendor_lookup(module, name) is not None


def target_module(backend):
    """The module ``getattr(torch, <target device type>)``, or None where torch has none."""
    module = getattr(torch, backend.device_type, None)
    return module if isinstance(module, types.ModuleType) else None
