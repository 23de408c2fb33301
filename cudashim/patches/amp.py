"""AMP: ``torch.autocast("cuda")``, ``GradScaler("cuda")`` and the autocast state queries.

The classes are patched in place (their ``__init__``), not replaced, so ``torch.autocast``
stays the class torch and its compiler know. The dtype of a CUDA region is the precision
policy's (``cudashim.precision``): float16, where the target computes it slowly, runs in a
dtype it computes fast. A region asked for the target's own device type is one too: programs
derive autocast's device type from their tensors (``torch.autocast(x.device.type, ...)``, as
timm does), which name the target under the shim; its default dtype is the target's. float32,
which CUDA's autocast takes and the host's refuses, runs with autocast off. Another dtype the
target cannot autocast to at all falls back to its first supported one, with a warning once.
"""

import functools
import logging

import torch

from ..errors import warn_once
from ..patching.rewriter import DEVICE_TYPE, rewrite

log = logging.getLogger(__name__)

REWRITES = (
    # GradScaler() means GradScaler("cuda").
    rewrite("torch.amp.grad_scaler:GradScaler.__init__", DEVICE_TYPE, missing="cuda",
            api="torch.amp.GradScaler"),
    # C functions whose first argument (or device_type=) is a device type string.
    *(rewrite(f"torch:{name}", DEVICE_TYPE, parameter="device_type", position=0)
      for name in ("is_autocast_enabled", "set_autocast_enabled", "get_autocast_dtype",
                   "set_autocast_dtype")),
    rewrite("torch.amp.autocast_mode:is_autocast_available", DEVICE_TYPE, parameter="device_type",
            aliases=("torch.amp:is_autocast_available",)),
    *(rewrite(f"torch.amp:{name}", DEVICE_TYPE, parameter="device_type")
      for name in ("custom_fwd", "custom_bwd")),
    # FSDP's scaler says device="cuda" by default, as GradScaler does.
    rewrite("torch.distributed.fsdp.sharded_grad_scaler:ShardedGradScaler.__init__", DEVICE_TYPE,
            missing="cuda", api="ShardedGradScaler"),
    rewrite("torch.library:register_autocast", DEVICE_TYPE, parameter="device_type"),
)
TRANSLATES = (("torch.amp.autocast_mode:autocast.__init__", "device_type"),)


def install(activation):
    """autocast is more than a rewrite: CUDA's default dtype, the precision policy (a dtype
    the target computes slowly becomes one it computes fast) and the target's dtype gaps."""
    backend = activation.backend
    supported = backend.autocast_dtypes()
    translate = activation.translator.type_for("torch.autocast")
    policy = activation.precision

    def make_autocast_init(original):
        def __init__(self, device_type, dtype=None, enabled=True, cache_enabled=None):
            if device_type == "cuda" or device_type == backend.device_type:
                if device_type == "cuda":
                    device_type = translate(device_type)
                    asked = torch.float16 if dtype is None else dtype    # CUDA's default dtype
                else:
                    asked = torch.get_autocast_dtype(device_type) if dtype is None else dtype
                dtype = policy.autocast_dtype(asked) if enabled else asked
                if dtype != asked:
                    _say_once(activation, asked, dtype, policy)
                if dtype is None or dtype == torch.float32 and dtype not in supported:
                    # float32 (the policy's, or asked: CUDA's autocast takes it and computes its
                    # cast ops in float32, where the target's refuses it): the region runs
                    # without autocast, its matmuls reconciling what autocast would have cast
                    dtype, enabled = asked, False
                    self._cudashim_in_float32 = True
                if dtype not in supported:
                    if enabled:        # a region the policy turned off runs in float32: nothing to say
                        warn_once(f"autocast-{dtype}",
                                  f"autocast: the '{backend.name}' backend cannot autocast to "
                                  f"{dtype}; using {supported[0]}")
                    dtype = supported[0]
            original(self, device_type, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
        return functools.wraps(original)(__init__)

    activation.replace(torch.amp.autocast_mode.autocast, "__init__", make_autocast_init)
    _count_float32_regions(activation, policy.float32_regions)


def _count_float32_regions(activation, regions):
    """Entering and leaving a CUDA region that runs in float32 is counted per thread: inside
    one, the matmul family reconciles the reduced dtypes autocast would have cast."""
    autocast = torch.amp.autocast_mode.autocast

    def make_enter(original):
        def __enter__(self):
            entered = original(self)
            if self.__dict__.get("_cudashim_in_float32"):
                regions.depth += 1
            return entered
        return functools.wraps(original)(__enter__)

    def make_exit(original):
        def __exit__(self, *exception):
            if self.__dict__.get("_cudashim_in_float32"):
                regions.depth -= 1
            return original(self, *exception)
        return functools.wraps(original)(__exit__)

    activation.replace(autocast, "__enter__", make_enter)
    activation.replace(autocast, "__exit__", make_exit)


_said = set()


def _say_once(activation, asked, became, policy):
    backend = activation.backend
    became = "float32 (autocast off)" if became is None else str(became)
    # its own row: torch.autocast's says where it ran
    activation.count(f"torch.autocast(dtype={asked})", became)
    if asked not in _said:
        _said.add(asked)
        log.info("cudashim: autocast %s is slow on the '%s' backend; the region runs in %s "
                 "(--amp-dtype %s; 'as-asked' keeps %s)", asked, backend.name, became,
                 policy.amp_dtype, asked)
