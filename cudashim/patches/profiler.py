"""torch.profiler: ProfilerActivity.CUDA becomes the target's activity, or is dropped.

Left in on a build without CUDA, it makes the profiler log a failure on every op.
"""

from .rewriter import PROFILER_ACTIVITIES, rewrite

REWRITES = (
    rewrite("torch.profiler:profile.__init__", PROFILER_ACTIVITIES, parameter="activities",
            api="ProfilerActivity.CUDA"),
)
