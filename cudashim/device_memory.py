"""Device memory as CUDA's allocator counts it, where the target's memory is host memory.

On the CPU backend torch's allocator keeps no statistics, and the process's resident memory
counts the interpreter, torch's libraries and every host tensor, and not pages allocated but
not yet touched. CUDA programs read ``torch.cuda.memory_allocated()`` to see what their model,
their batches and their optimizer hold on the device, and assert that it falls when they
offload (DeepSpeed's ``offload_states``) or delete a tensor, and rises by a tensor's size when
they make one.

``DeviceMemory`` counts the storages of the tensors the program put on the device: moved there
(``cudashim.residency`` places them), made there by a factory (``device="cuda"``), a module's
parameters and buffers moved there, and the state and gradients an optimizer steps for them.
Each storage counts once, however many views share it, from when it is placed until torch
frees it: torch keeps one Python object for each live storage, whose weak reference says when
the memory goes (a tensor deleted, its ``.data`` swapped for host memory, a storage resized
to nothing by FSDP). Results of ops (activations, temporaries) are not counted: no hook in
torch's host allocator says which of its blocks a program thinks of as device memory, short
of a dispatch hook on every op, whose cost every op would pay.
"""

from __future__ import annotations

import threading
import weakref


class DeviceMemory:
    """Bytes, storages and their peaks, counted per storage. Its compiled twin
    (``cudashim._speedups.DeviceMemory``) counts the same, at a constructor's cost."""

    def __init__(self):
        self._storages: dict = {}        # id(storage) -> (bytes, weak reference)
        self._lock = threading.Lock()    # weak-reference callbacks run in whichever thread frees
        self.allocated = self.peak = 0
        self.allocations = self.allocations_peak = 0
        self.allocated_total = self.freed_total = 0
        self.allocation_count = self.free_count = 0

    def add(self, tensor) -> None:
        """Count the storage under ``tensor`` (once, however often it is added)."""
        try:
            storage = tensor.untyped_storage()
        except (AttributeError, RuntimeError, NotImplementedError, TypeError):
            return                       # no storage of its own: a subclass, a sparse tensor
        key = id(storage)
        if key in self._storages:
            return
        size = storage.nbytes()
        storages, lock = self._storages, self._lock

        def freed(reference, key=key):
            with lock:
                entry = storages.get(key)
                if entry is None or entry[1] is not reference:
                    return
                del storages[key]
                self.allocated -= entry[0]
                self.allocations -= 1
                self.freed_total += entry[0]
                self.free_count += 1

        try:
            reference = weakref.ref(storage, freed)
        except TypeError:
            return
        with lock:
            if key in storages:
                return
            storages[key] = (size, reference)
            self.allocated += size
            self.allocations += 1
            self.allocated_total += size
            self.allocation_count += 1
            if self.allocated > self.peak:
                self.peak = self.allocated
            if self.allocations > self.allocations_peak:
                self.allocations_peak = self.allocations

    def holds(self, tensor) -> bool:
        """Whether the storage under ``tensor`` is counted."""
        try:
            return id(tensor.untyped_storage()) in self._storages
        except (AttributeError, RuntimeError, NotImplementedError, TypeError):
            return False

    def reset_peak(self) -> None:
        with self._lock:
            self.peak = self.allocated
            self.allocations_peak = self.allocations


def stats(memory) -> dict:
    """The keys of ``torch.cuda.memory_stats()`` that ``memory`` (either twin) answers. Nothing is
    cached: reserved memory is allocated memory, and every block is active."""
    bytes_figures = (memory.allocated, memory.peak, memory.allocated_total, memory.freed_total)
    counts = (memory.allocations, memory.allocations_peak, memory.allocation_count, memory.free_count)
    figures = {"allocated_bytes": bytes_figures, "reserved_bytes": bytes_figures,
               "active_bytes": bytes_figures, "requested_bytes": bytes_figures,
               "allocation": counts, "segment": counts, "active": counts}
    result = {}
    for name, (current, peak, allocated, freed) in figures.items():
        result[f"{name}.all.current"] = current
        result[f"{name}.all.peak"] = peak
        result[f"{name}.all.allocated"] = allocated
        result[f"{name}.all.freed"] = freed
    result.update({"num_alloc_retries": 0, "num_ooms": 0, "num_sync_all_streams": 0,
                   "num_device_alloc": memory.allocation_count, "num_device_free": memory.free_count,
                   "inactive_split.all.current": 0, "inactive_split_bytes.all.current": 0})
    return result
