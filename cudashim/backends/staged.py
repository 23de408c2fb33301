"""A collective library for accelerators that have none: collectives staged through host memory.

A vendor extension may register a device with torch but no ``torch.distributed`` backend for
it (torchvulkan has none). A program's NCCL request then becomes this process group: each
collective copies the device tensors it is given to host memory, runs gloo's collective on
the copies, and copies what gloo wrote back into the device tensors; tensors already in host
memory go to gloo untouched. Torch builds a whole process group from a Python one, so this
group serves every device, the host included.

A collective on device tensors finishes before the call returns (the copies back need gloo's
result); the handle given back is complete, and its future holds the device tensors, as
gloo's holds its own. Host tensors keep gloo's asynchronous work. A send or a receive of a
device tensor stays asynchronous, as NCCL's are: two ranks that each send before they receive
(a pipeline schedule's ``batch_isend_irecv``) would otherwise wait for each other forever. A
send hands gloo its host copy and returns gloo's work; a receive returns a work that a thread
of the group completes once gloo's has, with the copy back into the device tensor.

The host copies are made in staging buffers the group keeps from one collective to the next,
as NCCL keeps its own: fresh host memory would be written page by page for the first time
at every collective, which costs the kernel a page fault per page (for 64 MiB, four times the
copy itself). An argument the collective only writes (an all-gather's outputs, a receive's
buffer) is staged without copying its contents in.

The group's own methods run every collective; gloo is also registered in it as the backend of
each device it serves, so that what torch reads from a group's backends (its name, which
``DeviceMesh.from_group`` and the functional collectives use) is there.
"""

from __future__ import annotations

import functools
import threading

import torch

NAME = "staged"

# Each collective of torch's ProcessGroup: (gloo's method for it, the argument it writes, or
# None where it writes nothing). torch 2.13 calls the ``*_single`` names; older torch and
# C++ callers (DDP) the others.
_COLLECTIVES = {
    "allreduce": ("allreduce", 0), "allreduce_coalesced": ("allreduce_coalesced", 0),
    "broadcast": ("broadcast", 0), "reduce": ("reduce", 0),
    "allgather": ("allgather", 0), "allgather_coalesced": ("allgather_coalesced", 0),
    "_allgather_base": ("_allgather_base", 0), "all_gather_single": ("_allgather_base", 0),
    "gather": ("gather", 0), "scatter": ("scatter", 0),
    "reduce_scatter": ("reduce_scatter", 0), "_reduce_scatter_base": ("_reduce_scatter_base", 0),
    "reduce_scatter_single": ("_reduce_scatter_base", 0),
    "alltoall": ("alltoall", 0), "alltoall_base": ("alltoall_base", 0),
    "all_to_all_single": ("alltoall_base", 0),
    "recv": ("recv", 0), "recv_anysource": ("recv_anysource", 0), "send": ("send", None),
    "barrier": ("barrier", None), "monitored_barrier": ("monitored_barrier", None),
}
# The collectives whose written argument they do not read: staged without its contents.
_WRITE_ONLY = {"allgather", "allgather_coalesced", "_allgather_base", "all_gather_single", "gather",
               "scatter", "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
               "alltoall", "alltoall_base", "all_to_all_single", "recv", "recv_anysource"}
# Coalesced forms gloo lacks: (outputs, inputs, opts), run pair by pair with the single form.
_PAIRWISE = {"all_gather_single_coalesced": "all_gather_single",
             "allgather_into_tensor_coalesced": "all_gather_single",
             "reduce_scatter_single_coalesced": "reduce_scatter_single",
             "reduce_scatter_tensor_coalesced": "reduce_scatter_single"}


@functools.lru_cache(maxsize=None)
def _group_class(library: str = NAME):
    """Made on first use: torch builds without ``torch.distributed`` have no ProcessGroup.
    ``library`` is its name: cudashim's test accelerator registers the same staging under
    a name of its own."""
    import torch.distributed as dist
    from torch._C._distributed_c10d import ProcessGroupGloo, _create_work_from_future

    class HostStagedGroup(dist.ProcessGroup):
        """A process group whose collectives run on gloo, through host copies of device
        tensors."""

        def __init__(self, store, rank: int, size: int, timeout):
            super().__init__(rank, size)
            self._host = ProcessGroupGloo(store, rank, size, timeout)
            self._staging = StagingBuffers()
            # torch keeps a group's name, and answers which backend serves a device, through
            # the backends registered in it: gloo's, for every device this library serves.
            for device_type in dist.Backend.backend_capability.get(library, ["cpu"]):
                self._register_backend(torch.device(device_type), dist.ProcessGroup.BackendType.GLOO, self._host)

        def getBackendName(self) -> str:
            return library

        def _collective(self, name, *args, **options):
            method, written = _COLLECTIVES[name]
            copies = []                           # (device tensor, its host copy)
            skipped = written if name in _WRITE_ONLY else None
            staged = tuple(_on_host(value, copies, self._staging, index != skipped)
                           for index, value in enumerate(args))
            if not copies:
                return getattr(self._host, method)(*staged, **options)   # gloo's own work
            if name == "send":           # gloo's work holds the host copy until it is sent
                return self._host.send(*staged, **options)
            if name == "recv":
                return self._received(self._host.recv(*staged, **options), copies)
            getattr(self._host, method)(*staged, **options).wait()      # opts=, as torch passes it
            with torch.no_grad():            # a written tensor may be a leaf that requires grad
                for device, host in copies:
                    if written is not None and _contains(args[written], device):
                        device.copy_(host)
            # (not after a failure: gloo may still be writing into them)
            self._staging.give_back(host for _, host in copies)
            return _done(args[written] if written is not None else [])

        def _received(self, work, copies):
            """A work complete once gloo's receive is and its tensor is copied to the device."""
            return _pending_receive_class()(work, copies, self._staging)

        def _pairwise(self, name, outputs, inputs, opts):
            for output, given in zip(outputs, inputs):
                getattr(self, _PAIRWISE[name])(output, given, opts).wait()
            return _done(list(outputs))

    def _done(value):
        """A finished work whose future holds ``value``."""
        future = torch.futures.Future()
        future.set_result(value)
        return _create_work_from_future(future)

    for name in _COLLECTIVES:
        setattr(HostStagedGroup, name, _forwarding(name, "_collective"))
    for name in _PAIRWISE:
        setattr(HostStagedGroup, name, _forwarding(name, "_pairwise"))
    return HostStagedGroup


@functools.lru_cache(maxsize=None)
def _pending_receive_class():
    """Made on first use: torch builds without ``torch.distributed`` have no ``Work``."""

    class PendingReceive(torch.distributed.Work):
        """A receive into device tensors: gloo receives into host copies, and a thread of its
        own copies them to the device once gloo's work is complete. ``wait()`` raises what
        failed, as gloo's own work does."""

        def __init__(self, work, copies, staging):
            super().__init__()
            self._future = torch.futures.Future()
            self._copies = copies
            threading.Thread(target=self._complete, args=(work, staging),
                             name="cudashim-staged-recv", daemon=True).start()

        def _complete(self, work, staging):
            try:
                work.wait()
                with torch.no_grad():       # the buffer may be a leaf that requires grad
                    for device, host in self._copies:
                        device.copy_(host)
            except Exception as error:
                self._future.set_exception(error)
                return
            staging.give_back(host for _, host in self._copies)
            self._future.set_result([device for device, _ in self._copies])

        def wait(self, timeout=None):
            self._future.wait()             # raises the receive's failure
            return True

        def is_completed(self):
            return self._future.done()

        def is_success(self):
            return self.is_completed() and not self._failed()

        def exception(self):
            try:
                self._future.value()
            except Exception as error:
                return error
            return None

        def _failed(self):
            return self.exception() is not None

        def get_future(self):
            return self._future

        def result(self):
            return self._future.value()

        def synchronize(self):
            self.wait()

    return PendingReceive


def _forwarding(name, how):
    def collective(self, *args, **options):
        return getattr(self, how)(name, *args, **options)
    collective.__name__ = collective.__qualname__ = name
    collective.__doc__ = f"torch's ``{name}`` on gloo, staged through host memory for device tensors."
    return collective


class StagingBuffers:
    """Host buffers kept between collectives, by dtype and size. A buffer is taken by one
    collective at a time (collectives on one group may come from several threads), and at
    most ``KEPT_BYTES`` are kept; what is given back past that is freed."""

    KEPT_BYTES = 1 << 30

    def __init__(self):
        self._free: dict = {}                 # (dtype, numel) -> [flat host buffer]
        self._kept = 0
        self._lock = threading.Lock()

    def take(self, like: torch.Tensor) -> torch.Tensor:
        """A contiguous host tensor of ``like``'s shape and dtype, its contents undefined."""
        key = (like.dtype, like.numel())
        with self._lock:
            free = self._free.get(key)
            buffer = free.pop() if free else None
            if buffer is not None:
                self._kept -= buffer.nbytes
        if buffer is None:
            buffer = torch.empty(like.numel(), dtype=like.dtype)
        return buffer.view(like.shape)

    def give_back(self, tensors) -> None:
        with self._lock:
            for tensor in tensors:
                flat = tensor.view(-1)
                if self._kept + flat.nbytes > self.KEPT_BYTES:
                    continue
                self._free.setdefault((flat.dtype, flat.numel()), []).append(flat)
                self._kept += flat.nbytes


def _on_host(value, copies, staging, read=True):
    """``value`` (tensors, nested in lists and tuples) with each device tensor replaced by a
    host copy in a staging buffer (its contents copied where the collective reads them),
    recorded in ``copies``."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            return value
        host = staging.take(value)
        if read:
            host.copy_(value)
        copies.append((value, host))
        return host
    if isinstance(value, (list, tuple)):
        return type(value)(_on_host(item, copies, staging, read) for item in value)
    return value


def _contains(value, tensor) -> bool:
    if isinstance(value, torch.Tensor):
        return value is tensor
    if isinstance(value, (list, tuple)):
        return any(_contains(item, tensor) for item in value)
    return False


# The names under which this staging is registered (this module's own and the test accelerator's).
LIBRARIES = {NAME}


def creator(library: str = NAME):
    """torch.distributed's constructor for the library (``Backend.register_backend``), under
    the name ``library``."""
    LIBRARIES.add(library)

    def create(store, rank, size, timeout):
        return _group_class(library)(store, rank, size, timeout)
    return create


create = creator()
