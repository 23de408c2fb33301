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
        if activation.report is not None:
            activation.report.count(api, "math kernel fallback")
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
