"""Tensor methods that take or report a device, and storages' ``.cuda()``.

``Tensor.is_cuda`` and ``Tensor.get_device()`` answer by who asks:
torch's own modules hear the truth (they branch on ``is_cuda`` into CUDA-only code), the
program hears that its tensors are on CUDA.
"""

import functools

import torch

from .. import torch_names
from ..backends.host import HostStream
from ..patching.by_caller import ByCaller, apply as apply_by_caller
from ..patching.rewriter import DEVICE, PIN_MEMORY, Argument, Rewrite, apply, compiled_twin, rewrite
from ..residency import DEVICE as DEVICE_SIDE, PINNED as PINNED_SIDE
from .residency import compiled_stay

REWRITES = (
    # Tensor.to(self, *args, **kwargs): the device, when given, is the first positional.
    rewrite("torch:Tensor.to", DEVICE, position=1),
    # Tensor.to's parser, which libraries call themselves to learn where a tensor goes
    # (bitsandbytes' Int8Params.to, Lightning's module mixin, accelerate): the same device.
    # A Python function: dynamo registers its polyfill for whatever _parse_to is when it
    # loads, and accepts only functions (its polyfill parses devices with torch.device,
    # which translates).
    rewrite("torch._C._nn:_parse_to", DEVICE, position=0, compiled=False),
    # the constructors a tensor has: pin_memory as torch's own constructors take it
    *(Rewrite(f"torch:Tensor.{name}", (Argument(DEVICE), Argument(PIN_MEMORY, "pin_memory")), places=True,
              inherits=True)
      for name in ("new_empty", "new_empty_strided", "new_zeros", "new_ones", "new_full", "new_tensor")),
    rewrite("torch:TypedStorage.to", DEVICE),
    rewrite("torch:UntypedStorage.to", DEVICE),
    *(rewrite(f"torch:TypedStorage.{name}", DEVICE, missing="cuda")     # device="cuda" by default
      for name in ("pin_memory", "is_pinned")),
    rewrite("torch:TypedStorage.__new__", DEVICE),
    rewrite("torch:TypedStorage.__init__", DEVICE),
)
# Pinning for a device (deprecated): translated on targets that pin; elsewhere install()
# makes pinning a no-op.
PINNING = tuple(rewrite(f"torch:Tensor.{name}", DEVICE) for name in ("pin_memory", "is_pinned"))


def _pinning_for(device_type: str):
    """PINNING, where pinning with no device pins for the target: torch pins for its build's
    accelerator (CUDA on a CUDA build; before 2.5, CUDA always), so where that is not the
    target a call naming none pins for the target, as CUDA's pins for CUDA."""
    current_accelerator = torch_names.get("torch.accelerator.current_accelerator", None)
    built_for = current_accelerator() if current_accelerator is not None else None
    if built_for is not None and built_for.type == device_type:
        return PINNING
    return tuple(rewrite(declaration.target, DEVICE, missing="cuda") for declaration in PINNING)


# The parameters install() translates.
TRANSLATES = (("torch:Tensor.cuda", "device"), ("torch:TypedStorage.cuda", "device"),
              *((d.target, "device") for d in PINNING))


def builtin_device_getter(device_type):
    """``TensorBase.is_<type>`` where that C getter checks ``device_type``; None otherwise.
    A vendor's PrivateUse1 device may take the name of a device type torch has in-tree
    (torchvulkan's "vulkan"), whose getter checks the in-tree type instead."""
    if device_type == torch._C._get_privateuse1_backend_name():
        return None
    return vars(torch._C.TensorBase).get(f"is_{device_type}")


def on_target_check(backend):
    """A fast ``tensor -> bool``: does the tensor live on the target device type?"""
    getter = builtin_device_getter(backend.device_type)
    if getter is not None:
        return getter.__get__
    device_type = backend.device_type
    return lambda t: t.device.type == device_type


def is_cuda_property(activation, real_is_cuda):
    """``Tensor.is_cuda``: the truth for callers that hear it, else True on the target too."""
    doc = "True for tensors on the target device"
    backend, compiled, hears_truth = activation.backend, activation.compiled, activation.callers.hears_truth
    if compiled is not None:
        # TensorBase.is_<type> is read in C as a descriptor; otherwise the Python check.
        on_target = builtin_device_getter(backend.device_type) or on_target_check(backend)
        return compiled.IsCuda(activation.callers.compiled_cache(compiled), real_is_cuda, on_target, doc)
    on_target, real = on_target_check(backend), real_is_cuda.__get__

    def is_cuda(self):
        if hears_truth():
            return real(self)
        return on_target(self) or real(self)

    return property(is_cuda, doc=doc)


def install(activation):
    T = torch.Tensor
    backend, settings, registry = activation.backend, activation.settings, activation.registry
    compiled = activation.compiled
    real_to = torch._C.TensorBase.to

    translate_cuda = activation.translator.for_api("Tensor.cuda")

    residency = activation.residency

    def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
        target = translate_cuda("cuda" if device is None else device)
        return real_to(self, device=target, non_blocking=non_blocking, memory_format=memory_format)

    translated = cuda
    if residency is not None:            # where device memory is host memory, a move is a copy
        def cuda(self, device=None, non_blocking=False, memory_format=torch.preserve_format):
            result = translated(self, device, non_blocking, memory_format)
            return residency.moved(self, result, DEVICE_SIDE, "Tensor.cuda")

    if compiled is not None:             # t.cuda() and t.cuda(i) without a Python frame
        # To host memory, Tensor.cpu() is the same move as to(cpu) with less argument parsing;
        # not where the moves copy, since a torch function mode hands torch.Tensor.cpu, which
        # then means a move to the host, what TensorBase.cpu was called for.
        host = backend.target_device(None) if backend.device_type == "cpu" and residency is None \
            else None
        fast = compiled.DefaultDevice(
            real_to, translated, "cuda", *activation.translator.compiled_translation(translate_cuda),
            host, torch._C.TensorBase.cpu)
        if residency is not None:
            fast = compiled_stay(activation, residency)(fast, cuda, DEVICE_SIDE, "Tensor.cuda")
        cuda = compiled_twin(fast, cuda)
    registry.set_attr(T, "cuda", cuda)

    if not settings.is_honest("is_cuda"):
        real_is_cuda = vars(torch._C.TensorBase)["is_cuda"]
        registry.set_attr(T, "is_cuda", is_cuda_property(activation, real_is_cuda))
        if backend.shares_devices:
            apply_by_caller(activation, ByCaller("torch:Tensor.get_device", _index_the_program_sees))

    if backend.can_pin_memory():
        for declaration in _pinning_for(backend.device_type):
            apply(activation, declaration)
    else:
        # Host memory is already where the target computes: nothing to pin. Where device
        # memory is host memory, pinning still returns a copy, as CUDA's does, which a move
        # to the device copies again (a staging buffer refilled after its non-blocking move).
        def pin_memory(self, device=None):
            if residency is None:
                activation.count("Tensor.pin_memory", "a no-op: host memory is the target's")
                return self
            activation.count("Tensor.pin_memory", "host memory, which the target computes on")
            return residency.moved(self, self, PINNED_SIDE, "Tensor.pin_memory")

        def is_pinned(self, device=None):
            return residency is not None and residency.side_of(self) == PINNED_SIDE

        activation.replace(T, "pin_memory", lambda original: functools.wraps(original)(pin_memory))
        activation.replace(T, "is_pinned", lambda original: functools.wraps(original)(is_pinned))

    def make_record_stream(original):
        def record_stream(self, stream):
            if isinstance(stream, HostStream):   # one queue: no reuse across streams to guard
                return None
            return original(self, stream)
        return functools.wraps(original)(record_stream)

    activation.replace(T, "record_stream", make_record_stream)

    translate_storage = activation.translator.for_api("Storage.cuda")
    for storage_cls in (torch.UntypedStorage, torch.TypedStorage):
        def make_storage_cuda(original):
            def storage_cuda(self, device=None, non_blocking=False):
                target = translate_storage("cuda" if device is None else device)
                return self.to(device=target, non_blocking=non_blocking)
            return functools.wraps(original)(storage_cuda)
        activation.replace(storage_cls, "cuda", make_storage_cuda)



def _index_the_program_sees(activation, original):
    """``Tensor.get_device()`` where CUDA indices share devices: the device's own index is
    not the program's; its current CUDA device is."""
    backend, on_target = activation.backend, on_target_check(activation.backend)

    def get_device(self):
        return backend.current_device() if on_target(self) else original(self)
    return get_device
