"""NCCL becomes the target's collective library.

In this module "backend" means what it means to ``torch.distributed``: a process-group
backend string ("nccl", "cuda:nccl", "cpu:gloo,cuda:nccl"), parsed as torch documents
them. cudashim's own backend is the ``target``: the cuda entry takes its device type and
collective library.
"""

import functools
import weakref

import torch

from ..callers import asked_by_torch
from .rewriter import BOUND_DEVICE, BOUND_DEVICES, BOUND_INDICES, DEVICE, DEVICE_TYPE, \
    Argument, Rewrite, rewrite

REWRITES = (
    # DDP takes no device_ids for CPU modules; other targets take their real devices.
    Rewrite("torch.nn.parallel:DistributedDataParallel.__init__",
            (Argument(BOUND_DEVICES, "device_ids"), Argument(BOUND_DEVICE, "output_device")),
            api="DistributedDataParallel(device_ids)"),
    rewrite("torch.distributed:barrier", BOUND_INDICES, parameter="device_ids"),
    rewrite("torch.distributed.device_mesh:init_device_mesh", DEVICE_TYPE, parameter="device_type",
            aliases=("torch.distributed:init_device_mesh",)),
    rewrite("torch.distributed.device_mesh:DeviceMesh.__init__", DEVICE_TYPE,
            parameter="device_type", api="DeviceMesh"),
    rewrite("torch.distributed.fsdp:FullyShardedDataParallel.__init__", DEVICE,
            parameter="device_id", api="FullyShardedDataParallel(device_id)"),
)


def translate_backend(backend, target):
    """The process-group backend string that replaces ``backend`` on the target."""
    if backend is None:
        return target.process_group_backend()
    text = str(backend).lower()
    if ":" not in text:
        return target.process_group_backend() if text == "nccl" else backend
    pairs = []
    for entry in text.split(","):
        device, _, library = entry.strip().partition(":")
        if device == "cuda" or library == "nccl":
            device, library = target.device_type, target.collective
        if (device, library) not in pairs:
            pairs.append((device, library))
    devices = [d for d, _ in pairs]
    if len(set(devices)) != len(devices):              # cpu:gloo and cpu:gloo (from cuda) merge
        pairs = list(dict(pairs).items())
    if len(pairs) == 1 and pairs[0][0] == "cpu":
        return pairs[0][1]
    return ",".join(f"{d}:{lib}" for d, lib in pairs)


class NcclSpellings:
    """Which groups the program asked NCCL for, and how it spelled it ("nccl",
    "cuda:nccl", ...): ``get_backend()`` answers the program with that spelling."""

    def __init__(self):
        self.default = None
        self.groups = weakref.WeakKeyDictionary()

    def remember_default(self, backend) -> None:
        self.default = _nccl_spelling(backend)

    def remember_group(self, group, backend) -> None:
        spelling = _nccl_spelling(backend) if backend is not None else self.default
        if spelling is not None and group is not None:
            self.groups[group] = spelling

    def spelling(self, group):
        return self.default if group is None else self.groups.get(group)


def install(activation):
    """The process-group calls: more than a rewrite (the spelling is remembered)."""
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist

    target, report = activation.backend, activation.report
    spellings = None if activation.settings.is_honest("get_backend") else NcclSpellings()

    def translated(api, backend):
        new = translate_backend(backend, target)
        if report is not None and new != backend:
            report.count(api, new)
        return new

    translate_device_id = BOUND_DEVICE.build(activation, "init_process_group(device_id)")

    def make_init_process_group(original):
        def init_process_group(*args, **kwargs):
            requested = args[0] if args else kwargs.get("backend")
            if args:
                args = (translated("init_process_group", requested),) + args[1:]
            else:
                kwargs["backend"] = translated("init_process_group", requested)
            if kwargs.get("device_id") is not None:
                kwargs["device_id"] = translate_device_id(kwargs["device_id"])
            result = original(*args, **kwargs)
            if spellings is not None:
                spellings.remember_default(requested)
            return result
        return functools.wraps(original)(init_process_group)

    def make_new_group(original):
        def new_group(*args, **kwargs):
            if len(args) > 2:
                requested = args[2]
                args = args[:2] + (translated("new_group", requested),) + args[3:]
            else:
                requested = kwargs.get("backend")
                kwargs["backend"] = translated("new_group", requested)
            group = original(*args, **kwargs)
            if spellings is not None:
                spellings.remember_group(group, requested)
            return group
        return functools.wraps(original)(new_group)

    activation.replace(dist, "init_process_group", make_init_process_group)
    activation.replace(dist, "new_group", make_new_group)
    activation.replace(dist, "is_nccl_available", lambda original: functools.wraps(original)(
        lambda: dist.is_backend_available(target.collective)))

    if spellings is not None:
        def make_get_backend(original):
            def get_backend(group=None):
                real = original(group)
                if asked_by_torch():       # torch chooses devices by the real library
                    return real
                spelling = spellings.spelling(group)
                if spelling is None:
                    return real
                if report is not None:
                    report.count("get_backend", f"{spelling} (really {real})")
                return spelling
            return functools.wraps(original)(get_backend)

        activation.replace(dist, "get_backend", make_get_backend)


def _nccl_spelling(backend):
    """How the program spelled an NCCL request ("nccl", "cuda:nccl", ...), or None."""
    if backend is None:
        return None                  # no backend asked for: torch's choice, reported as is
    text = str(backend).lower()
    return text if "nccl" in [part.rpartition(":")[2] for part in text.split(",")] else None
