"""NCCL becomes the target's collective library.

In this module "backend" means what it means to ``torch.distributed``: a process-group
backend string ("nccl", "cuda:nccl", "cpu:gloo,cuda:nccl"), parsed as torch documents
them. cudashim's own backend is the ``target``: the cuda entry takes its device type and
collective library.
"""

import functools
import time
import weakref

import torch

from ...backends import staged
from ...patching import by_caller
from ...patching.by_caller import ByCaller
from ...patching.rewriter import BOUND_DEVICE, BOUND_DEVICES, BOUND_INDICES, DEVICE, DEVICE_TYPE, \
    EAGER_DEVICE, Argument, Rewrite, rewrite, rewritten
from . import ddp_pinned, elastic_rounds, mesh_alltoall, mesh_attention, mesh_rng, nccl_batches, nccl_order, nccl_reductions, nccl_shapes, sync_batch_norm
from .group_exit import NcclGroupExit

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
    rewrite("torch.distributed.device_mesh:DeviceMesh.from_group", DEVICE_TYPE,
            parameter="device_type", api="DeviceMesh.from_group"),
    *(rewrite(f"torch.distributed.distributed_c10d:{name}", DEVICE, api=f"{name}(device)",
              aliases=(f"torch.distributed:{name}",))
      for name in ("broadcast_object_list", "send_object_list", "recv_object_list")),
    *(rewrite(target, DEVICE, api="pipelining stage") for target in (
        "torch.distributed.pipelining.stage:PipelineStage.__init__",
        "torch.distributed.pipelining.stage:build_stage",
        "torch.distributed.pipelining._IR:Pipe.build_stage")),
)
# Eager init binds a device: the target's, or none on the CPU and where collectives are staged
# through host memory. install() patches these two calls, and translates their device_id with
# these declarations.
# torch 2.7 and older destroy a process group holding the GIL while gloo's worker threads end
# (pytorch#154976, fixed in 2.8). A worker still freeing its last collective's tensors needs the
# GIL to let go of their Python storage (``all_gather_object``'s), and the two wait on each other
# for ever: ranks hung in destroy_process_group under load (the 3-D mesh program, 4 of 12 runs
# two jobs at a time). Letting go of the GIL a moment first lets that worker finish.
_DESTROYS_HOLDING_THE_GIL = torch.torch_version.TorchVersion(torch.__version__) < (2, 8)
_GLOO_WORKERS_FINISH = 0.05          # seconds

BOUND_DEVICE_IDS = {name: rewrite(f"torch.distributed.distributed_c10d:{name}", EAGER_DEVICE,
                                  parameter="device_id", api=f"{name}(device_id)")
                    for name in ("init_process_group", "new_group")}
TRANSLATES = tuple((d.target, "device_id") for d in BOUND_DEVICE_IDS.values())


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
        self.groups = weakref.WeakKeyDictionary()      # group -> its spelling, or None

    def remember_default(self, backend) -> None:
        self.default = _nccl_spelling(backend)

    def remember_group(self, group, backend) -> None:
        # Ranks outside a group get a sentinel (an int), not a group: nothing to remember.
        if isinstance(group, torch.distributed.ProcessGroup):
            self.groups[group] = _nccl_spelling(backend) if backend is not None else self.default

    def spelling(self, group, same_library_as_default: bool):
        """The program's spelling for ``group``. A group made without naming a backend
        (``split_group``, a DeviceMesh's sub-meshes) has its parent's library: it is spelled
        as the default group is when it runs the same library."""
        if group is None:
            return self.default
        if isinstance(group, torch.distributed.ProcessGroup) and group in self.groups:
            return self.groups[group]
        return self.default if same_library_as_default else None


def install(activation):
    """The process-group calls: more than a rewrite (the spelling is remembered)."""
    if not torch.distributed.is_available():
        return
    import torch.distributed as dist

    target = activation.backend
    if target.collective == staged.NAME:
        _register_library(activation, dist, staged.NAME, staged.create, ["cpu", target.device_type])
    spellings = None if activation.settings.is_honest("get_backend") else NcclSpellings()
    nccl_groups = NcclGroupExit(activation, dist)

    def translated(api, backend):
        new = translate_backend(backend, target)
        if new != backend:
            activation.count(api, new)
        return new

    def make_init_process_group(torch_init_process_group):
        original = rewritten(activation, BOUND_DEVICE_IDS["init_process_group"], torch_init_process_group)

        def init_process_group(*args, **kwargs):
            requested = args[0] if args else kwargs.get("backend")
            if args:
                args = (translated("init_process_group", requested),) + args[1:]
            else:
                kwargs["backend"] = translated("init_process_group", requested)
            result = original(*args, **kwargs)
            if spellings is not None:
                spellings.remember_default(requested)
            if requested is None or _asks_for_nccl(requested):    # torch's default on CUDA is NCCL
                nccl_groups.remember(dist.distributed_c10d._get_default_group())
            return result
        return functools.wraps(torch_init_process_group)(init_process_group)

    def make_new_group(torch_new_group):
        original = rewritten(activation, BOUND_DEVICE_IDS["new_group"], torch_new_group)

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
            if _asks_for_nccl(requested) or requested is None and nccl_groups.has_default():
                nccl_groups.remember(group)
            return group
        return functools.wraps(torch_new_group)(new_group)

    def make_destroy_process_group(original):
        def destroy_process_group(*args, **kwargs):
            live_before = nccl_groups.live_ids()
            if _DESTROYS_HOLDING_THE_GIL:
                time.sleep(_GLOO_WORKERS_FINISH)
            original(*args, **kwargs)
            nccl_groups.released(live_before)
        return functools.wraps(original)(destroy_process_group)

    # Patched at home as well: torch's own new_subgroups*, DeviceMesh and FSDP call
    # distributed_c10d.new_group, and their NCCL requests need translating as the program's.
    c10d = dist.distributed_c10d
    patches = [("init_process_group", make_init_process_group), ("new_group", make_new_group),
               ("destroy_process_group", make_destroy_process_group)]
    if target.collective != "nccl":         # NCCL's shapes and order, for the library it became
        patches += _nccl_semantics(c10d, nccl_groups)
    for name, make in patches:
        replacement = activation.replace(c10d, name, make)
        if getattr(dist, name) is activation.registry.original(c10d, name):
            activation.registry.set_attr(dist, name, replacement)
    real_new_group = activation.registry.original(c10d, "new_group")
    for owner in (c10d, dist):
        activation.replace(owner, "split_group",
                           lambda original: _splitting_anywhere(original, c10d, real_new_group))
    # DeviceMesh calls the three by the names it imported from distributed_c10d: without these,
    # a mesh's subgroups (HSDP's replicas, each dimension of a 2-D mesh) would be gloo's groups
    # to cudashim, without NCCL's averages, order and exit.
    def meshes_make_groups_as_the_program_does(device_mesh):
        for name in ("init_process_group", "new_group", "split_group"):      # split_group: torch 2.5+
            if hasattr(c10d, name) and vars(device_mesh).get(name) is activation.registry.original(c10d, name):
                activation.registry.set_attr(device_mesh, name, getattr(c10d, name))
    activation.when_imported("torch.distributed.device_mesh", meshes_make_groups_as_the_program_does)
    activation.replace(dist, "is_nccl_available", lambda original: functools.wraps(original)(
        lambda: dist.is_backend_available(target.collective)))
    if target.device_type == "cpu":            # SyncBatchNorm where CUDA's devices are the host
        activation.replace(torch.nn.SyncBatchNorm, "forward", sync_batch_norm.forward_on_the_host)
        activation.replace(torch.nn.parallel.DistributedDataParallel, "_passing_sync_batchnorm_handle",
                           sync_batch_norm.ddp_accepts_it_on_the_host)
        activation.when_imported(FSDP_MODULE, lambda module: activation.replace(
            module.FullyShardedDataParallel, "set_state_dict_type", _state_dicts_without_offload))
        activation.when_imported(FSDP_MODULE, lambda module: activation.replace(
            module, "_init_device_handle", _fsdp_device_on_the_host))

    ddp_pinned.install(activation)
    elastic_rounds.install(activation)
    mesh_rng.install(activation)
    mesh_attention.install(activation)
    mesh_alltoall.install(activation)

    if spellings is not None:        # torch chooses devices by the real library: it hears it
        def spelled(original):
            def get_backend(group=None):
                real = original(group)
                spelling = spellings.spelling(group, group is None or real == original(None))
                return real if spelling is None else spelling
            return get_backend

        by_caller.apply(activation, ByCaller("torch.distributed:get_backend",
                                             lambda _, original: spelled(original),
                                             became="the backend as the program spelled it"))


def _register_library(activation, dist, name, create, devices) -> None:
    """``Backend.register_backend`` for cudashim's own collective library; deactivation
    takes out what it added (torch has no way to unregister)."""
    Backend = dist.Backend
    if name.upper() in Backend._plugins:
        return
    before = {device: Backend.default_device_backend_map.get(device) for device in devices}
    Backend.register_backend(name, create, devices=devices)

    def unregister():
        Backend._plugins.pop(name.upper(), None)
        for table in (Backend.backend_capability, Backend.backend_type_map):
            table.pop(name, None)
        if name in Backend.backend_list:
            Backend.backend_list.remove(name)
        for device, previous in before.items():
            if Backend.default_device_backend_map.get(device) == name:
                if previous is None:
                    del Backend.default_device_backend_map[device]
                else:
                    Backend.default_device_backend_map[device] = previous
        if vars(Backend).get(name.upper()) == name:
            delattr(Backend, name.upper())

    activation.registry.add_undo(f"torch.distributed backend {name!r}", unregister)


def _nccl_semantics(c10d, nccl_groups) -> list:
    """(name, make) for each collective that needs NCCL's tensor shapes, its averages, its
    issue order or a form the library lacks kept on the library NCCL became: one wrapper per
    name, the lacking forms outermost, then the shapes; and for ``batch_isend_irecv``, NCCL's
    one work per batch."""
    def made_for_nccl(group) -> bool:
        return nccl_groups.knows(c10d._get_default_group() if group is None else group)

    def completes_out_of_order(group) -> bool:
        library = c10d._world.pg_map.get(group, (None,))[0]
        return nccl_groups.knows(group) and library is not None and any(
            part.rpartition(":")[2] in nccl_order.COMPLETES_OUT_OF_ORDER
            for part in str(library).split(","))

    ordered = nccl_order.in_issue_order(nccl_order.IssueOrder(c10d, completes_out_of_order))
    names = nccl_order.collectives(c10d)
    averaged = nccl_reductions.wrappers(c10d, made_for_nccl)
    names += [name for name in (*nccl_shapes.WRAPPERS, *averaged) if hasattr(c10d, name) and name not in names]

    served = nccl_reductions.served_forms(c10d, made_for_nccl)

    def make(name):
        unchanged = lambda original: original  # noqa: E731
        shaped, averaging = nccl_shapes.WRAPPERS.get(name, unchanged), averaged.get(name, unchanged)
        serving = served.get(name, unchanged)
        return lambda original: serving(shaped(averaging(ordered(original))))
    batches = [("batch_isend_irecv", nccl_batches.coalescing(made_for_nccl))] \
        if hasattr(c10d, "batch_isend_irecv") else []
    return [(name, make(name)) for name in names] + batches


FSDP_MODULE = "torch.distributed.fsdp.fully_sharded_data_parallel"


def _state_dicts_without_offload(original):
    """FSDP's state dicts ``offload_to_cpu`` where CUDA's devices are the host. FSDP offloads
    with ``.cpu()``, which copies a CUDA tensor but returns a host tensor itself; FSDP then
    frees the unsharded parameters it gathered, and the state dict's entries point into freed
    memory (a segmentation fault in Lightning's ``strategy="fsdp"``, which offloads). Without
    the offload FSDP clones each entry, which is the copy the offload stood for."""
    import dataclasses

    def without_offload(config):
        return dataclasses.replace(config, offload_to_cpu=False) \
            if getattr(config, "offload_to_cpu", False) else config

    @functools.wraps(original)
    def set_state_dict_type(module, state_dict_type, state_dict_config=None, optim_state_dict_config=None):
        return original(module, state_dict_type, without_offload(state_dict_config),
                        without_offload(optim_state_dict_config))
    return staticmethod(set_state_dict_type)


def _fsdp_device_on_the_host(original):
    """FSDP without ``device_id`` takes its device from the module's parameters, or from torch's
    accelerator when they are on the host; with none it refuses ("FSDP needs a non-CPU
    accelerator device"). A CUDA module moved to CUDA's devices on the CPU backend has its
    parameters on the host, where CUDA's would be on its device: that device is the host."""
    @functools.wraps(original)
    def init_device_handle(state, module, ignored_params, device_id):
        if device_id is None:
            device_id = torch.device("cpu")
        return original(state, module, ignored_params, device_id)
    return init_device_handle


def _splitting_anywhere(original, c10d, new_group):
    """``split_group`` where the target's library cannot split a communicator (gloo cannot;
    torch then refuses): the splits become groups of their global ranks, with the parent's
    library. ``new_group`` is torch's own: a split is spelled as its parent, as torch's are.

    Splitting the default group, every rank makes every split, in order, as ``new_group``
    wants. A subgroup's splits are made by their members only (``use_local_synchronization``),
    whose names torch derives from how many groups each rank has: members must have made
    the same groups before, as for any group made that way."""
    @functools.wraps(original)
    def split_group(parent_pg=None, split_ranks=None, timeout=None, pg_options=None,
                    group_desc=None, backend=None):
        default = c10d._get_default_group()
        parent = parent_pg or default
        if not split_ranks or _library_splits(c10d, parent):
            return original(parent_pg, split_ranks, timeout, pg_options, group_desc, backend)
        parent_ranks = c10d.get_process_group_ranks(parent)
        library = backend or c10d._world.pg_map[parent][0]
        everyone = parent is default
        rank, mine = c10d.get_rank(), None
        for split in split_ranks:
            members = [parent_ranks[group_rank] for group_rank in split]
            if everyone or rank in members:
                group = new_group(members, timeout=timeout, pg_options=pg_options, backend=library,
                                  use_local_synchronization=not everyone, group_desc=group_desc)
                if rank in members:
                    mine = group
        return mine                    # None for a rank in no split, as torch answers
    return split_group


def _library_splits(c10d, parent) -> bool:
    """Whether torch's own split_group can split ``parent`` here (a bound device, an
    accelerator, a library that supports splitting)."""
    if c10d._get_default_group().bound_device_id is None or not torch.accelerator.is_available():
        return False
    library = parent._get_backend(torch.accelerator.current_accelerator())
    return bool(library) and library.supports_splitting


def _asks_for_nccl(backend) -> bool:
    return _nccl_spelling(backend) is not None


def _nccl_spelling(backend):
    """How the program spelled an NCCL request ("nccl", "cuda:nccl", ...), or None."""
    if backend is None:
        return None                  # no backend asked for: torch's choice, reported as is
    text = str(backend).lower()
    return text if "nccl" in [part.rpartition(":")[2] for part in text.split(",")] else None
