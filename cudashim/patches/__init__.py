"""The patch groups, applied in this order by ``cudashim.activation``.

A group is a module here that may declare:

- ``REWRITES``: device-argument patches as data (``rewriter.Rewrite``), applied by the one
  rewriter;
- ``BY_CALLER``: answers that depend on who asks (``by_caller.ByCaller``);
- ``WHEN_IMPORTED``: patches made when their module is imported (``when_imported.WhenImported``);
- ``install(activation)``: the patches that are more than a rewrite, as code, recorded in
  ``activation.registry`` like every other;
- ``TRANSLATES``: the ("module:attribute.path", parameter) pairs its ``install()``
  translates, so that ``device_parameters`` knows every device parameter a group covers;
- ``SUPPORTED_TORCH = (lowest, below)``: the torch versions it supports (``below`` may be
  None). Outside them the group stays off, with one warning.

A private or newer torch name a group reads is an entry of ``torch_names.NAMES``: where the
running torch lacks one, the group does without it (the entry's fallback), or stays off with one
warning naming the torch and the name, as it does when its install meets a name torch lacks (it
takes back what it had patched first).

Any group can be switched off with ``--disable GROUP`` / ``CUDASHIM_DISABLE``, as tracing
libraries let users disable one integration; ``cudashim doctor`` lists which are on. The
order matters only where one group's replacement calls another's: the proxy ``torch.cuda``
goes in after the device and AMP patches it relies on.

Another package adds a group without editing cudashim: an entry point in
``cudashim.patch_groups`` names its module (``plugins.py``). Such groups are applied after the
built-in ones, in the order the entry points come, and ``--disable`` and ``doctor`` know them.

This module imports no torch: settings check group names against ``names()``.
"""

from __future__ import annotations

import importlib
from typing import Dict, List, Optional, Tuple

from .. import plugins

GROUPS: Tuple[str, ...] = (
    "torchscript",     # first: its builtin table follows every replacement the others make
    "environment",     # visible-devices variables, before any vendor runtime starts
    "frameworks",      # DeepSpeed on its accelerator for the target; Lightning, Accelerate on CUDA
    "version_gates",   # torch.version.cuda, torch.backends.cuda.is_built(): by who asks
    "device_objects",  # torch.device, Generator, set_default_device, get_device_module
    "residency",       # host-device moves are copies where device memory is host memory
    "host_memory",     # freed host memory kept for the next tensors, as CUDA's caching allocator
    "factories",       # torch.zeros(..., device="cuda") and every other constructor
    "tensors",         # Tensor.to/cuda/is_cuda/new_*/pin_memory, storages
    "legacy_types",    # torch.cuda.FloatTensor as a value: Tensor.type, set_default_tensor_type
    "modules",         # nn.Module.to/to_empty
    "torch_accelerator",  # torch.accelerator.synchronize("cuda") and its other device arguments
    "amp",             # autocast, GradScaler, autocast state queries
    "optimizers",      # capturable=True on the target's device, as CUDA graphs need it
    "precision",       # float16 matmuls in float32 where float16 is slow; TF32 flags mapped
    "reductions",      # long norms and dots as exact as CUDA's where the kernels are the CPU's
    "serialization",   # torch.load(map_location=...)
    "data",            # DataLoader(pin_memory_device="cuda")
    "flags",           # sdpa_kernel / sdp_kernel fallback
    "profiler",        # ProfilerActivity.CUDA
    "distributed",     # NCCL -> the target's collective library
    "data_parallel",   # nn.DataParallel, nn.parallel and torch.cuda.comm on the target's devices
    "compiled",        # torch.compile hears the same is_cuda as eager code
    "extensions",      # building a CUDA C++ extension: refused with the way out
    "substitutes",     # flash_attn, xformers, apex, pynvml: stand-ins where the real one fails
    "kernel_gaps",     # what CUDA kernels do and the target's lack: wider dtypes, CUDA-only ops
    "layouts",         # sparse tensors held on the host where the target has no sparse kernels
    "triton",          # Triton kernels: the target's Triton backend, else Triton's interpreter
    "cuda_module",     # the proxy torch.cuda and its submodules
    "device_module",   # the target's device module answers the torch.cuda names it lacks
    "tracebacks",      # an uncaught refusal's traceback ends at the program's line
)
DEFAULT_SUPPORTED_TORCH = ("2.4", None)


def from_entry_points() -> Dict[str, str]:
    """name -> module, for every group another package registered."""
    return plugins.registered(plugins.PATCH_GROUPS, GROUPS)


def names() -> Tuple[str, ...]:
    """Every group, in the order applied: the built-in ones, then those from entry points."""
    return GROUPS + tuple(from_entry_points())


def group_module(name: str):
    if name in GROUPS:
        return importlib.import_module(f"{__name__}.{name}")
    return importlib.import_module(from_entry_points()[name])


def summary(name: str) -> str:
    """The first paragraph of the group's docstring, on one line, as a terminal shows it (no
    reStructuredText literals)."""
    paragraph = (group_module(name).__doc__ or "").strip().split("\n\n")[0]
    return " ".join(paragraph.split()).replace("``", "")


def supported_torch(name: str) -> Tuple[str, Optional[str]]:
    return getattr(group_module(name), "SUPPORTED_TORCH", DEFAULT_SUPPORTED_TORCH)


def off_reason(name: str, settings) -> Optional[str]:
    """Why group ``name`` stays off under these settings and this torch, or None."""
    if not settings.is_enabled(name):
        return "disabled by the setting"
    import torch
    from torch.torch_version import TorchVersion

    from .. import torch_names

    lowest, below = supported_torch(name)
    version = TorchVersion(torch.__version__)
    if version < lowest or (below is not None and version >= below):
        bounds = f">={lowest}" + (f",<{below}" if below else "")
        return f"torch {version} is outside the versions it supports ({bounds})"
    lacking = torch_names.turned_off(name)
    if lacking is not None:
        return f"torch {version} has no {lacking[0]} ({lacking[1]})"
    return None


def states(settings) -> List[Tuple[str, Optional[str]]]:
    """[(group, why it is off or None)] in the order they are applied."""
    return [(name, off_reason(name, settings)) for name in names()]


def apply_all(activation) -> None:
    """Apply every group that is on: its declarations, then its code."""
    from .. import torch_names
    from ..errors import warn_once
    from ..patching import by_caller, when_imported
    from ..patching import rewriter

    for name, off in states(activation.settings):
        if off is not None:
            if activation.settings.is_enabled(name):
                warn_once(f"group-{name}", f"cudashim leaves the '{name}' patches off: {off}")
            continue
        done = len(activation.registry)
        try:
            _apply(activation, group_module(name), by_caller, when_imported, rewriter)
        except Exception as error:
            # A name this torch lacks never kills activation: the group takes back what it did
            # and stays off, with one warning naming the torch and the name.
            lacking = torch_names.lacked_by_torch(error)
            if lacking is None:
                raise
            activation.registry.revert_to(done)
            import torch
            warn_once(f"group-{name}", f"cudashim leaves the '{name}' patches off: torch "
                                       f"{torch.__version__} has no {lacking}")


def _apply(activation, module, by_caller, when_imported, rewriter) -> None:
    for declaration in getattr(module, "REWRITES", ()):
        rewriter.apply(activation, declaration)
    for declaration in getattr(module, "BY_CALLER", ()):
        by_caller.apply(activation, declaration)
    for declaration in getattr(module, "WHEN_IMPORTED", ()):
        when_imported.apply(activation, declaration)
    install = getattr(module, "install", None)
    if install is not None:
        install(activation)
