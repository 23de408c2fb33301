"""Attention-kernel choice: ``sdpa_kernel([...])`` and ``torch.backends.cuda.sdp_kernel``.

A CUDA program may allow only kernels the target lacks (memory-efficient or cuDNN
attention on the CPU); scaled_dot_product_attention would then find no kernel and fail.
Inside such a block cudashim also enables the math kernel, warning once. The cuDNN and
TF32 flags need nothing: setting them is harmless where they do not apply.
"""

import contextlib
import functools

import torch
import torch.backends.cuda
import torch.nn.attention

from ..errors import warn_once
from ..patching.watched import WatchedAttributes


def _enabled_backends():
    from torch.nn.attention import SDPBackend
    flags = torch.backends.cuda
    enabled = {SDPBackend.MATH: flags.math_sdp_enabled(),
               SDPBackend.FLASH_ATTENTION: flags.flash_sdp_enabled(),
               SDPBackend.EFFICIENT_ATTENTION: flags.mem_efficient_sdp_enabled(),
               SDPBackend.CUDNN_ATTENTION: flags.cudnn_sdp_enabled()}
    return {b for b, on in enabled.items() if on}


def install(activation):
    backend = activation.backend
    available = backend.sdpa_backends()

    @contextlib.contextmanager
    def ensure_a_target_kernel(api):
        if _enabled_backends() & available:
            yield
            return
        warn_once(f"sdpa-{api}",
                  f"{api}: the '{backend.name}' backend has none of the requested attention "
                  "kernels; falling back to the math kernel")
        activation.count(api, "math kernel fallback")
        torch.backends.cuda.enable_math_sdp(True)
        try:
            yield
        finally:
            torch.backends.cuda.enable_math_sdp(False)

    def wrap(api):
        def make(original):
            @functools.wraps(original)
            @contextlib.contextmanager
            def kernel_choice(*args, **kwargs):
                with original(*args, **kwargs), ensure_a_target_kernel(api):
                    yield
            return kernel_choice
        return make

    activation.replace(torch.nn.attention, "sdpa_kernel", wrap("torch.nn.attention.sdpa_kernel"))
    activation.replace(torch.backends.cuda, "sdp_kernel", wrap("torch.backends.cuda.sdp_kernel"))
    if activation.reporting:
        _count_flags(activation)


# The cuDNN flags a program sets (its questions are counted where they are answered,
# in version_gates).
CUDNN_FLAGS = ("enabled", "benchmark", "deterministic", "allow_tf32", "fp32_precision")
TF32_FLAGS = ("allow_tf32", "fp32_precision")


def _count_flags(activation):
    backend = activation.backend
    mapped = activation.precision.float32_matmul_precision if activation.precision else None
    no_effect = f"no effect: {backend.device_type} has no cuDNN"

    def became(flag):
        return f"oneDNN {mapped} float32 precision" if flag in TF32_FLAGS and mapped else no_effect

    cudnn_class = type(torch.backends.cudnn)
    for flag in CUDNN_FLAGS:
        current = vars(cudnn_class).get(flag)           # torch's ContextProp, or a property
        if not hasattr(current, "__set__"):
            continue

        def counted_set(module, value, _flag=flag, _current=current):
            activation.count(f"torch.backends.cudnn.{_flag} =", became(_flag))
            _current.__set__(module, value)
        activation.registry.set_attr(cudnn_class, flag, property(
            lambda module, _current=current: _current.__get__(module, cudnn_class), counted_set,
            doc=current.__doc__))
    activation.registry.set_attr(torch.backends.cuda, "matmul", WatchedAttributes(
        torch.backends.cuda.matmul,
        lambda flag, value: activation.count(f"torch.backends.cuda.matmul.{flag} =", became(flag))))
