"""Legacy CUDA tensor types as values: ``t.type(torch.cuda.HalfTensor)``, ``t.type()``,
``torch.set_default_tensor_type(torch.cuda.HalfTensor)``.

torch's C++ accepts only its own type objects there, and the proxy's classes are not; each
call taking one is answered here with the element type it names on the target. A CUDA
default tensor type sets torch's default dtype (through the CPU type of that dtype, so
torch checks it as it would) and, on a target other than the CPU, the default device, which
a later non-CUDA default type, or deactivation, takes back.
"""

import functools

import torch

from .. import legacy_types
from ..residency import DEVICE, HOST
from .tensors import on_target_check


def install(activation):
    _tensor_type(activation)
    _default_tensor_type(activation)


def _tensor_type(activation):
    settings, hears_truth = activation.settings, activation.callers.hears_truth
    on_target = on_target_check(activation.backend)
    translate = activation.translator.for_api("Tensor.type")
    real_to = torch._C.TensorBase.to
    residency = activation.residency      # where device memory is host memory: moves copy

    def make_type(original):
        def type_(self, dtype=None, non_blocking=False, **kwargs):
            if dtype is None:
                if not settings.is_honest("is_cuda") and on_target(self) and not hears_truth():
                    return legacy_types.TENSOR_NAME_BY_DTYPE.get(self.dtype) or original(self)
                return original(self)
            name = legacy_types.cuda_tensor_name(dtype)
            if name is not None:
                result = real_to(self, device=translate("cuda"), dtype=legacy_types.TENSOR_NAMES[name],
                                 non_blocking=non_blocking)
                return result if residency is None else residency.moved(self, result, DEVICE, "Tensor.type")
            result = original(self, dtype, non_blocking, **kwargs)
            if residency is not None and legacy_types.names_a_host_type(dtype):
                return residency.moved(self, result, HOST, "Tensor.type")
            return result
        return functools.wraps(original)(type_)

    activation.replace(torch.Tensor, "type", make_type)


def _default_tensor_type(activation):
    backend = activation.backend
    target = activation.translator.translate("cuda")     # once, uncounted: no call made it
    replaced_default = []          # the default device a CUDA default type replaced

    def make_set_default_tensor_type(original):
        def set_default_tensor_type(t):
            name = legacy_types.cuda_tensor_name(t)
            if name is None:
                original(t)
                if replaced_default:
                    torch.set_default_device(replaced_default.pop())
                return
            original(legacy_types.host_tensor_name(name))    # torch's own checks and errors
            if backend.device_type != "cpu" and not replaced_default:
                previous = torch.get_default_device()
                replaced_default.append(None if previous.type == "cpu" else previous)
                torch.set_default_device(target)
        return functools.wraps(original)(set_default_tensor_type)

    activation.replace(torch, "set_default_tensor_type", make_set_default_tensor_type)

    def give_back_default_device():
        if replaced_default:
            torch.set_default_device(replaced_default.pop())

    activation.registry.add_undo("the default device of a CUDA default tensor type",
                                 give_back_default_device)
