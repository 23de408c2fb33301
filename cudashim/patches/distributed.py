"""NCCL becomes the target's collective library.

Backend strings are parsed as torch documents them ("nccl", "cuda:nccl",
"cpu:gloo,cuda:nccl"); the cuda entry takes the target's device type and library.
"""

import functools
import weakref

import torch

from ..devices import asked_by_torch


def translate_backend(spec, backend):
    """The process-group backend string that replaces ``spec`` on the target."""
    if spec is None:
        return backend.process_group_backend()
    text = str(spec).lower()
    if ":" not in text:
        return backend.process_group_backend() if text == "nccl" else spec
    pairs = []
    for entry in text.split(","):
        device, _, library = entry.strip().partition(":")
        if device == "cuda" or library == "nccl":
            device, library = backend.device_type, backend.collective
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

    def remember_default(self, spec) -> None:
        self.default = _nccl_spelling(spec)

    def remember_group(self, group, spec) -> None:
        spelling = _nccl_spelling(spec) if spec is not None else self.default
        if spelling is not None and group is not None:
            self.groups[group] = spelling

    def spelling(self, group):
        return self.default if group is None else self.groups.get(group)


def install(ctx):
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    backend, report = ctx.backend, ctx.report
    spellings = None if ctx.settings.is_honest("get_backend") else NcclSpellings()

    def translated(api, spec):
        new = translate_backend(spec, backend)
        if report is not None and new != spec:
            report.count(api, new)
        return new

    translate_device = ctx.translate_for("init_process_group(device_id)")

    def make_init_process_group(original):
        def init_process_group(*args, **kwargs):
            requested = args[0] if args else kwargs.get("backend")
            if args:
                args = (translated("init_process_group", requested),) + args[1:]
            else:
                kwargs["backend"] = translated("init_process_group", requested)
            device_id = kwargs.get("device_id")
            if device_id is not None:
                target = translate_device(device_id)
                # gloo binds no device; the CPU backend drops it, others pass the real device
                kwargs["device_id"] = None if target.__class__ is torch.device and \
                    target.type == "cpu" else target
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

    ctx.replace(dist, "init_process_group", make_init_process_group)
    ctx.replace(dist, "new_group", make_new_group)
    ctx.replace(dist, "is_nccl_available", lambda original: functools.wraps(original)(
        lambda: dist.is_backend_available(backend.collective)))

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

        ctx.replace(dist, "get_backend", make_get_backend)

    def make_barrier(original):
        def barrier(group=None, async_op=False, device_ids=None):
            if device_ids is not None and backend.device_type == "cpu":
                device_ids = None                    # gloo barriers bind no device
            return original(group=group, async_op=async_op, device_ids=device_ids)
        return functools.wraps(original)(barrier)

    ctx.replace(dist, "barrier", make_barrier)

    translate_ddp = ctx.translate_for("DistributedDataParallel(device_ids)")

    def make_ddp_init(original):
        def __init__(self, module, device_ids=None, output_device=None, *args, **kwargs):
            if device_ids is not None:
                targets = [translate_ddp(d) for d in device_ids]
                # DDP takes no device_ids for CPU modules; other targets take real devices
                device_ids = None if backend.device_type == "cpu" else targets
            if output_device is not None:
                target = translate_ddp(output_device)
                output_device = None if backend.device_type == "cpu" else target
            original(self, module, device_ids, output_device, *args, **kwargs)
        return functools.wraps(original)(__init__)

    ctx.replace(DistributedDataParallel, "__init__", make_ddp_init)
    _device_meshes_and_fsdp(ctx)


def _device_meshes_and_fsdp(ctx):
    """``init_device_mesh("cuda", ...)``, ``DeviceMesh("cuda", ...)`` and FSDP's
    ``device_id=`` name the target instead."""
    ctx.when_imported("torch.distributed.device_mesh", functools.partial(_patch_device_mesh, ctx))
    ctx.when_imported("torch.distributed.fsdp", functools.partial(_patch_fsdp, ctx))


def _patch_device_mesh(ctx, mesh_module):
    if hasattr(mesh_module, "init_device_mesh"):
        translate_mesh = ctx.translate_type("init_device_mesh")
        ctx.replace(mesh_module, "init_device_mesh", functools.partial(
            _first_argument, name="device_type", translate=translate_mesh))
        translate_class = ctx.translate_type("DeviceMesh")

        def make_mesh_init(original):
            def __init__(self, *args, **kwargs):
                if args:
                    args = (translate_class(args[0]),) + args[1:]
                elif "device_type" in kwargs:
                    kwargs["device_type"] = translate_class(kwargs["device_type"])
                original(self, *args, **kwargs)
            return functools.wraps(original)(__init__)

        ctx.replace(mesh_module.DeviceMesh, "__init__", make_mesh_init)
        if getattr(torch.distributed, "init_device_mesh", None) is not None:
            ctx.registry.set_attr(torch.distributed, "init_device_mesh", mesh_module.init_device_mesh)


def _patch_fsdp(ctx, fsdp_module):
    if hasattr(fsdp_module, "FullyShardedDataParallel"):
        translate_id = ctx.translate_for("FullyShardedDataParallel(device_id)")

        def make_fsdp_init(original):
            def __init__(self, *args, **kwargs):
                if kwargs.get("device_id") is not None:
                    kwargs["device_id"] = translate_id(kwargs["device_id"])
                original(self, *args, **kwargs)
            return functools.wraps(original)(__init__)

        ctx.replace(fsdp_module.FullyShardedDataParallel, "__init__", make_fsdp_init)


def _first_argument(original, name, translate):
    def function(*args, **kwargs):
        if args:
            args = (translate(args[0]),) + args[1:]
        elif name in kwargs:
            kwargs[name] = translate(kwargs[name])
        return original(*args, **kwargs)
    return functools.wraps(original)(function)


def _nccl_spelling(spec):
    """How the program spelled an NCCL request ("nccl", "cuda:nccl", ...), or None."""
    if spec is None:
        return None                  # no backend asked for: torch's choice, reported as is
    text = str(spec).lower()
    return text if "nccl" in [part.rpartition(":")[2] for part in text.split(",")] else None
