"""torch.device, torch.Generator, set_default_device, get_device_module and RNG forks."""

import functools
import sys

import torch

from ..backends.host import HostStream
from ..patching.class_proxy import class_proxy, subclassable_class_proxy
from ..patching.rewriter import DEVICE, DEVICE_TYPE, rewrite

REWRITES = (
    rewrite("torch:set_default_device", DEVICE),
    # fork_rng() forks CUDA's generators when no accelerator is found: the target's, here.
    rewrite("torch.random:fork_rng", DEVICE_TYPE, parameter="device_type", missing="cuda"),
    rewrite("torch.utils.checkpoint:set_device_states", DEVICE_TYPE, parameter="device_type"),
    rewrite("torch.utils.checkpoint:DefaultDeviceType.set_device_type", DEVICE_TYPE),
)
# The parameters install() translates.
TRANSLATES = (("torch:Generator", "device"), ("torch:get_device_module", "device"))


def install(activation):
    real_device = torch.device
    translate = activation.translator.for_api("torch.device")
    device_named = activation.translator.device_named_for("torch.device")

    def construct_device(*args, **kwargs):
        if len(args) == 1 and not kwargs:
            spec = args[0]
            if spec.__class__ is str:
                return device_named(spec)
            if spec.__class__ is int:
                return translate(spec)              # torch.device(0): a CUDA index
            if spec.__class__ is real_device:
                # torch.device(x.device), and torch's own DeviceContext(device): the device
                # itself, whose identity says which side it means where both are the host
                return translate(spec)
        return translate(real_device(*args, **kwargs))

    # Compiled: torch.device("cuda") is one dict lookup, without a Python frame.
    named = getattr(device_named, "named", None)
    call = None if activation.compiled is None or named is None else \
        activation.compiled.NamedDevice(named, construct_device)
    activation.registry.set_attr(torch, "device", class_proxy(real_device, construct_device, call))

    real_generator = torch.Generator
    translate_generator = activation.translator.for_api("torch.Generator")

    def construct_generator(device="cpu"):
        return real_generator(device=translate_generator(device))

    activation.registry.set_attr(torch, "Generator", class_proxy(real_generator, construct_generator))

    target_type = activation.backend.device_type
    asked_by_torch = activation.callers.asked_by_torch

    def make_get_device_module(original):
        def get_device_module(device=None):
            if device is not None and _names_cuda(real_device, device):
                # torch names CUDA only when acting on the program's devices (fork_rng's
                # fallback, say): it gets the target's module, which answers torch.cuda's
                # names for the target (the 'device_module' group); the program gets the proxy.
                # torch.accelerator names the accelerator a CUDA build was compiled for, not the
                # program's: it gets torch.cuda, which tells torch the truth (no GPU here).
                if sys._getframe(1).f_globals.get("__name__") == "torch.accelerator":
                    return torch.cuda
                return original(target_type) if asked_by_torch() else torch.cuda
            return original(device)
        return functools.wraps(original)(get_device_module)

    activation.replace(torch, "get_device_module", make_get_device_module)
    _devices_cross_processes_as_they_are(activation, real_device)
    _device_generic_streams_on_host_streams(activation, real_device)


def _device_generic_streams_on_host_streams(activation, real_device):
    """``torch.Stream()`` and ``torch.Event()`` (the current accelerator's, or CUDA's by name)
    where the target has no streams of its own and the backend's are host streams (the CPU
    backend, torchvulkan): the backend's classes, which torch.cuda's streams are too, so a
    program mixes the two as on CUDA (transformers' offloaded KV cache prefetches on a
    ``torch.Stream()`` that waits for ``torch.cuda.default_stream()``). torch's own would refuse:
    "Backend doesn't support create a new Stream", or a CPU stream without events."""
    backend = activation.backend
    host_stream, host_event = backend.Stream, backend.Event
    if not (isinstance(host_stream, type) and issubclass(host_stream, HostStream)):
        return
    translate = activation.translator.for_api("torch.Stream")
    device_object = backend.target_device(None)

    def on_the_target(device) -> bool:
        if device is None:
            return True                      # torch's: the current accelerator, CUDA's here
        target = translate(device)
        if target.__class__ is not real_device:
            target = real_device(target)
        if backend.device_type == "cpu":     # "cpu" by name is the host's, not the device's
            return target is device_object
        return target.type == backend.device_type

    def construct_stream(device=None, *, priority=0, **kwargs):
        if on_the_target(device):
            return host_stream(device, priority=priority)
        return real_stream(device, priority=priority, **kwargs)

    def construct_event(device=None, *, enable_timing=False, blocking=False, interprocess=False):
        if on_the_target(device):
            return host_event(enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)
        return real_event(device, enable_timing=enable_timing, blocking=blocking, interprocess=interprocess)

    real_stream, real_event = getattr(torch, "Stream", None), getattr(torch, "Event", None)
    if real_stream is None or real_event is None:
        return                               # before torch's device-generic streams
    activation.registry.set_attr(torch, "Stream", subclassable_class_proxy(real_stream, construct_stream,
                                                                           host_stream))
    activation.registry.set_attr(torch, "Event", subclassable_class_proxy(real_event, construct_event,
                                                                          host_event))


def _devices_cross_processes_as_they_are(activation, real_device):
    """A device sent to another process (``mp.spawn``'s arguments, queues) arrives as the
    device it was. torch pickles it as a call to ``torch.device``, which in a child under
    cudashim would translate a CUDA device that a framework holds on purpose (Lightning's
    ``ddp_spawn`` strategy) to the target's. Only multiprocessing's pickler is told: what
    ``torch.save`` writes stays plain torch."""
    from multiprocessing.reduction import ForkingPickler

    reducers = ForkingPickler._extra_reducers
    before = reducers.get(real_device)
    ForkingPickler.register(real_device, _reduce_device)

    def unregister():
        if before is None:
            reducers.pop(real_device, None)
        else:
            reducers[real_device] = before
    activation.registry.add_undo("devices sent to other processes", unregister)


def _reduce_device(device):
    return device_as_sent, (device.type,) if device.index is None else (device.type, device.index)


def device_as_sent(*args):
    """The device another process sent, untranslated (``torch._C.device`` is torch's own)."""
    return torch._C.device(*args)


def _names_cuda(real_device, device) -> bool:
    if device.__class__ is real_device:
        return device.type == "cuda"
    if isinstance(device, str):
        try:
            return real_device(device).type == "cuda"
        except RuntimeError:
            return False
    return False
