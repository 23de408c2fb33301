"""The patch groups, applied in this order by ``cudashim.activation``.

Each module has ``install(ctx)`` and records every change through ``ctx.registry``, so
deactivation undoes all of them from the same records. The order matters only where one
group's replacement calls another's: the proxy ``torch.cuda`` goes in after the device
and AMP patches it relies on.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Callable

import wrapt

ORDER = (
    "environment",     # visible-devices variables, before any vendor runtime starts
    "devices",         # torch.device, Generator, set_default_device, get_device_module
    "factories",       # torch.zeros(..., device="cuda") and every other constructor
    "tensors",         # Tensor.to/cuda/is_cuda/type/new_*/pin_memory, storages
    "modules",         # nn.Module.to/to_empty
    "amp",             # autocast, GradScaler, autocast state queries
    "serialization",   # torch.load(map_location=...)
    "data",            # DataLoader(pin_memory_device="cuda")
    "flags",           # sdpa_kernel / sdp_kernel fallback
    "profiler",        # ProfilerActivity.CUDA
    "distributed",     # NCCL -> the target's collective library
    "compiled",        # torch.compile hears the same is_cuda as eager code
    "cuda_module",     # the proxy torch.cuda and its submodules
)


@dataclasses.dataclass
class PatchContext:
    registry: Any
    backend: Any
    translator: Any
    settings: Any
    report: Any = None

    def replace(self, owner, name: str, make: Callable[[Any], Any]):
        """Patch ``owner.name`` with ``make(original)``; return the replacement."""
        original = wrapt.resolve_path(owner, name)[2]
        replacement = make(original)
        self.registry.set_attr(owner, name, replacement)
        return replacement

    def when_imported(self, module_name: str, patch: Callable[[Any], None]) -> None:
        """``patch(module)`` now if the module is imported, else when it is (heavy modules
        such as FSDP's and dynamo's cost start-up time nobody asked for). A module imported
        after deactivation is left alone."""
        module = sys.modules.get(module_name)
        if module is not None:
            patch(module)
            return
        backend = self.backend

        def on_import(module):
            from .. import _state
            if _state.ACTIVE.backend is backend:
                patch(module)

        wrapt.register_post_import_hook(on_import, module_name)

    def translate_for(self, api: str):
        return self.translator.for_api(api)

    def translate_type(self, api: str):
        """A translator for device *type* strings ("cuda" -> the target's type)."""
        target = self.backend.device_type
        report = self.report

        def translate_type(device_type):
            if device_type == "cuda":
                if report is not None:
                    report.count(api, target)
                return target
            return device_type
        return translate_type
