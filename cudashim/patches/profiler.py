"""torch.profiler: ProfilerActivity.CUDA becomes the target's activity, or is dropped.

Left in on a build without CUDA, it makes the profiler log a failure on every op.
"""

import functools

import torch.profiler


def install(ctx):
    ProfilerActivity = torch.profiler.ProfilerActivity
    replacement = ctx.backend.profiler_activity
    target_activity = getattr(ProfilerActivity, replacement) if replacement else None

    def translate(activities):
        if activities is None or ProfilerActivity.CUDA not in activities:
            return activities
        if ctx.report is not None:
            ctx.report.count("ProfilerActivity.CUDA", target_activity or "dropped")
        kept = [a for a in activities if a != ProfilerActivity.CUDA]
        if target_activity is not None and target_activity not in kept:
            kept.append(target_activity)
        return kept or [ProfilerActivity.CPU]

    def make_init(original):
        def __init__(self, *args, **kwargs):
            if args:
                args = (translate(args[0]),) + args[1:]
            if "activities" in kwargs:
                kwargs["activities"] = translate(kwargs["activities"])
            original(self, *args, **kwargs)
        return functools.wraps(original)(__init__)

    ctx.replace(torch.profiler.profile, "__init__", make_init)
