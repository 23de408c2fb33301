"""What the runtime does on one target, read from the tables the runtime itself uses.

The ``torch.cuda`` surface (``tables/cuda_surface.py``), the backend's class (device type, collective
library, visible-devices variable, kernel languages) and the patch groups' own declarations
(``patches.extensions``) answer every question the scanner asks about code the runtime
redirects. Nothing here is listed a second time: a name the proxy forwards is "handled"
because the proxy forwards it.
"""

from __future__ import annotations

import dataclasses
import functools
import types
from typing import Dict, Optional, Tuple

from .. import backends
from ..proxy.surface import classify
from ..tables import cuda_surface
from .findings import HANDLED, NEEDS_CHANGE

Verdict = Tuple[str, str, Optional[str]]          # (class, what happens, the fix or way out)


@dataclasses.dataclass(frozen=True)
class Target:
    """The backend a scan classifies for, by its class: it need not be present here."""
    name: str
    device_type: str
    collective: str
    visible_devices_var: Optional[str]
    redirects: bool
    kernel_languages: Tuple[str, ...]
    how_chosen: str
    deepspeed_accelerator: Optional[str] = None
    device_count: Optional[int] = None      # how many CUDA devices the run sees; None: unknown
    graph_class: Optional[str] = None       # the device module's own graph class, if it has one
    device_memory_is_host: bool = False     # moves copy only where the destination is named

    @classmethod
    def named(cls, name: str = backends.AUTO, device_count: Optional[int] = None) -> "Target":
        """The backend ``name`` (``auto``: the one this machine would use). ``device_count``:
        the run's --device-count; on the CPU backend the run's own default otherwise."""
        if name == backends.AUTO:
            backend_cls, how = backends.resolve(name)[0], "detected on this machine"
        else:
            backend_cls, how = backends.backend_class(name), "named explicitly"
        device_type = backend_cls.device_type
        accelerator_type = getattr(backend_cls, "accelerator_type", None)
        if accelerator_type is not None:
            device_type = accelerator_type() or device_type
        if device_count is None and device_type == "cpu" and backend_cls.redirects:
            device_count = _virtual_device_count()
        return cls(backend_cls.name, device_type, backend_cls.default_collective,
                   backend_cls.visible_devices_var, backend_cls.redirects,
                   backend_cls.kernel_languages, how, backend_cls.deepspeed_accelerator,
                   device_count, backend_cls.graph_class,
                   backend_cls.redirects and backend_cls.device_memory_is_host)

    def graphs(self) -> str:
        """What a CUDA-graph name becomes (Backend.graph_class, cudashim/graphs)."""
        if self.graph_class:
            return (f"the {self.device_type} device's own graphs (torch.{self.device_type}."
                    f"{self.graph_class}) where its build has them, else captured and replayed "
                    f"by cudashim")
        return ("captured by recording the ops that run on the target, and replayed into the "
                "capture's memory by cudashim")

    def lacks(self, index: int) -> bool:
        """Whether the run has no CUDA device ``index`` (as far as the scan can know)."""
        return self.redirects and self.device_count is not None and index >= self.device_count

    # --- torch.cuda, through the proxy's own classification ---------------------------
    def cuda_name(self, qualname: str) -> Verdict:
        """What ``torch.cuda.<...>`` (a module or a name in one) becomes."""
        if not self.redirects:
            return HANDLED, "native CUDA", None
        table, modules = _cuda_surface()
        parts = qualname.split(".")
        for depth in range(len(parts), 1, -1):          # the longest name the surface knows
            known = ".".join(parts[:depth])
            if known not in table:
                continue
            if known in modules and depth < len(parts):
                return self._not_in_surface(known, parts[depth])
            return self._surface_verdict(*table[known])
        return self._not_in_surface("torch", "cuda")

    def _not_in_surface(self, module: str, name: str) -> Verdict:
        if name.startswith("_"):
            return (NEEDS_CHANGE, f"a private name of the real {module}, which cudashim does not "
                                  f"redirect: on the '{self.name}' target it reaches no CUDA",
                    "use the public torch.cuda API it stands for")
        return (NEEDS_CHANGE, f"{module} has no public name '{name}' in this torch",
                "check the name against the installed torch")

    def _surface_verdict(self, kind: str, way_out: Optional[str]) -> Verdict:
        if kind == cuda_surface.BACKEND:
            return HANDLED, f"answered for the {self.device_type} device by the '{self.name}' backend", None
        if kind == cuda_surface.SHIM:
            return HANDLED, f"cudashim's own implementation on the '{self.name}' backend", None
        if kind == cuda_surface.SUBMODULE:
            return HANDLED, "cudashim's proxy for this module", None
        if kind == cuda_surface.SAME:
            return HANDLED, "the real object, right on every target", None
        if kind == cuda_surface.HARMLESS:
            return HANDLED, f"does nothing on the '{self.name}' target and warns once", way_out
        return (NEEDS_CHANGE, f"raises UnsupportedCudaAPI on the '{self.name}' target",
                way_out or cuda_surface.UNCLASSIFIED_WAY_OUT)

    # --- device specs, process-group backends, visible devices -------------------------
    def device(self, spec: str, index) -> Verdict:
        """``index``: the spec's index, "N" when the program computes it, or None."""
        if not self.redirects:
            return HANDLED, "native CUDA", None
        if isinstance(index, int) and self.lacks(index):
            count = self.device_count
            return (NEEDS_CHANGE, f"the device '{spec}' does not exist in the run: it sees {count} "
                                  f"CUDA device{'s' if count != 1 else ''}, and fails as CUDA does "
                                  f"with an invalid device ordinal",
                    f"run with --device-count {index + 1} (CUDASHIM_DEVICE_COUNT), and scan with "
                    f"the same option" if self.device_type == "cpu" else
                    f"run where the target has {index + 1} devices, or with --device-count "
                    f"{index + 1} to share the ones it has")
        if self.device_type == "cpu":
            became = "'cpu' (host memory" + (f", the CPU backend's virtual device {index}"
                                             if index is not None else "") + ")"
        else:
            became = f"'{self.device_type}" + (f":{index}'" if index is not None else "'")
        return HANDLED, f"the device '{spec}' becomes {became}", None

    def process_group(self, spec: str) -> Verdict:
        if not self.redirects:
            return HANDLED, "native CUDA", None
        return HANDLED, f"the process-group backend '{spec}' becomes '{self.collective}'", None

    def mesh_call(self, name: str) -> Verdict:
        """What a call of the device-mesh stack (``tables/meshes.py``) gets."""
        if not self.redirects:
            return HANDLED, "native CUDA", None
        from ..tables import meshes
        return HANDLED, meshes.CALLS[name].format(device=self.device_type, collective=self.collective), None

    def visible_devices(self) -> Verdict:
        if not self.redirects:
            return HANDLED, "native CUDA", None
        if self.visible_devices_var:
            return HANDLED, f"copied to {self.visible_devices_var} for the '{self.name}' runtime", None
        if self.device_type == "cpu":
            return HANDLED, "sizes the CPU backend's virtual CUDA devices", None
        return HANDLED, f"read as it is: the '{self.name}' backend has no visible-devices variable", None

    def nccl_variable(self, name: str) -> Verdict:
        """An NCCL environment variable the program or its job script sets or reads."""
        if not self.redirects:
            return HANDLED, "native CUDA", None
        from ..patches import _nccl_environment as nccl_environment
        libraries = nccl_environment.libraries_of(self.collective)
        return HANDLED, f"{name}: {nccl_environment.describe(name, libraries)}", None

    def framework_call(self, framework: str, accelerator) -> Optional[Verdict]:
        """What a call into a framework's device layer (``frameworks.ENTRY_POINTS``) gets."""
        if not self.redirects:
            return HANDLED, "native CUDA", None
        from ..patches import frameworks
        got = frameworks.what_it_gets(framework, accelerator, self.device_type, self.deepspeed_accelerator)
        if got is None:
            return None
        runs, what = got
        return (HANDLED, what, None) if runs else \
            (NEEDS_CHANGE, what, f"set {frameworks.SELECTOR} to an accelerator DeepSpeed has")

    def runs(self, language: str) -> bool:
        """Whether kernels written in ``language`` ("cuda", "triton") run on the target."""
        return language in self.kernel_languages


def _virtual_device_count() -> int:
    """The CPU backend's default: CUDASHIM_DEVICE_COUNT, else as many as CUDA_VISIBLE_DEVICES
    lists, else one (the run's own rule; under a launcher it is one per local rank)."""
    import os
    given = os.environ.get("CUDASHIM_DEVICE_COUNT", "").strip()
    if given.isdigit():
        return int(given)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([part for part in visible.split(",") if part.strip()])
    from ..job_layout import local_world_size
    return local_world_size() or 1


@functools.lru_cache(maxsize=None)
def _cuda_surface():
    """({"torch.cuda.<...>": (kind, way out)}, the module names among them) for the real
    torch.cuda, its submodules and every public name in them, classified as the proxy
    classifies them."""
    import torch.cuda

    table: Dict[str, Tuple[str, Optional[str]]] = {}
    modules = set()
    for module in cuda_surface.real_submodules(torch.cuda):
        modules.add(module.__name__)
        table[module.__name__] = (cuda_surface.SUBMODULE, None)
        for name in cuda_surface.public_names(module):
            if isinstance(getattr(module, name, None), types.ModuleType):
                continue                        # listed as a module of its own
            classified = classify(torch.cuda, module, name)
            table[f"{module.__name__}.{name}"] = classified or (cuda_surface.REFUSED,
                                                                cuda_surface.UNCLASSIFIED_WAY_OUT)
    return table, frozenset(modules)
