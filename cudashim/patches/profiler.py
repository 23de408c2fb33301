"""torch.profiler: ProfilerActivity.CUDA becomes the target's activity, or is dropped; and
``emit_nvtx`` (an NVTX range per op, for Nsight) becomes ``emit_itt`` on XPU, or does nothing.

Left in on a build without CUDA, ProfilerActivity.CUDA makes the profiler log a failure on
every op, and ``emit_nvtx`` raises "Torch not compiled with CUDA enabled".
"""

import functools

import torch

from ..patching.refusal import Refusal
from ..patching.rewriter import PROFILER_ACTIVITIES, rewrite

REWRITES = (
    rewrite("torch.profiler:profile.__init__", PROFILER_ACTIVITIES, parameter="activities",
            api="ProfilerActivity.CUDA"),
)

EMIT_NVTX = Refusal("torch.autograd.profiler.emit_nvtx",
                    "use torch.profiler, which records every op on the target",
                    harmless=True, nothing="records nothing")


def install(activation):
    """emit_nvtx is patched in place (its __enter__/__exit__): the class stays torch's."""
    backend = activation.backend
    profiler = torch.autograd.profiler
    itt = backend.device_type == "xpu" and torch.profiler.itt.is_available()

    def make_enter(original):
        @functools.wraps(original)
        def __enter__(self):
            if not self.enabled:
                return original(self)
            if itt:                                  # Intel's tracing API: VTune shows the ranges
                self._cudashim_itt = profiler.emit_itt(record_shapes=self.record_shapes)
                self._cudashim_itt.__enter__()
                return self
            EMIT_NVTX.meet(activation)
            return self
        return __enter__

    def make_exit(original):
        @functools.wraps(original)
        def __exit__(self, *exc):
            inner = self.__dict__.pop("_cudashim_itt", None)
            if inner is not None:
                inner.__exit__(*exc)
            return False
        return __exit__

    activation.replace(profiler.emit_nvtx, "__enter__", make_enter)
    activation.replace(profiler.emit_nvtx, "__exit__", make_exit)
