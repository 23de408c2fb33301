"""DTensor's random ops on a target whose generator counts no offsets.

A random op on a DTensor (``nn.init`` of a sharded weight, dropout in a tensor-parallel block,
``torch.distributed.tensor.randn``) runs inside the RNG tracker's region, which torch builds on
CUDA's Philox generator: every rank reads the same (seed, offset) state, moves the offset to
where its shard begins, draws, and then moves every rank's offset past the whole tensor. Ranks
holding the same shard draw the same numbers, ranks holding different shards different ones,
and the generators stay in step. The state is 16 bytes, and torch reads it as such.

A generator of another kind has no offset to move: the host's (the CPU target, whose CUDA
meshes are host meshes) and the test accelerator's are Mersenne Twisters. torch refuses the
first ("OffsetBasedRNGTracker instantiation requires the presence of CUDA/CUDA-like/XPU
device. Got cpu instead") and fails an assertion on the second. Here the same contract is kept
with seeds instead of offsets. A region reads the generator's state and reduces it to a key,
the same on every rank whose generator is in step. The shard is drawn from a generator seeded
with (key, the shard's index in the mesh), and afterwards every rank's generator is seeded
with (key, past the op). What a rank draws depends only on the seed the program gave and the
ops it ran, so a resumed run draws what the first one drew; a Philox generator keeps torch's
own tracker.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging

import torch

from ... import torch_names

log = logging.getLogger(__name__)

# DTensor's random module, and its tracker: ``torch.distributed.tensor._random`` from torch 2.5,
# ``torch.distributed._tensor.random`` before.
TRACKERS = {
    "torch.distributed.tensor._random": "torch.distributed.tensor._random.OffsetBasedRNGTracker",
    "torch.distributed._tensor.random": "torch.distributed._tensor.random.OffsetBasedRNGTracker",
}

_PHILOX_STATE_BYTES = 16         # (seed, offset), two 64-bit words
_PAST_THE_OP = -1                # the key's index for the state after a region


def install(activation) -> None:
    patched = set()

    def patch(module) -> None:
        tracker = torch_names.get(TRACKERS[module.__name__], None)
        if tracker is None or tracker in patched:       # one class, reached by two module names
            return
        patched.add(tracker)
        target = activation.backend
        activation.replace(tracker, "__init__", lambda original: _initializing(original, target))
        activation.replace(tracker, "_distribute_region", _seeding_regions)
        activation.replace(tracker, "_manual_seed", _seeding_the_generator)

    for name in TRACKERS:
        activation.when_imported(name, patch)


class SeededRegions:
    """The regions of one tracker on a generator without offsets."""

    def __init__(self, generator: torch.Generator, device: torch.device):
        self.generator = generator
        self.device = device

    @contextlib.contextmanager
    def region(self, spec, user_generator=None):
        """Draw the shard ``spec`` describes, then step every rank's generator past the op.
        A generator the program passed is the one read and stepped, as torch's tracker does;
        the draw itself comes from the device's, which torch's dispatch leaves the op."""
        source = self.generator if user_generator is None else user_generator
        key = state_key(source)
        saved = None if user_generator is None else self.generator.get_state()
        self.generator.manual_seed(derived_seed(key, shard_index(spec)))
        try:
            yield
        finally:
            if saved is not None:
                self.generator.set_state(saved)
            source.manual_seed(derived_seed(key, _PAST_THE_OP))

    def synchronize(self) -> None:
        """Every rank takes rank 0's generator state (torch's ``run_state_sync``)."""
        state = self.generator.get_state()
        on_device = state.to(self.device)
        torch.distributed.broadcast(on_device, 0)
        if not torch.equal(on_device.cpu(), state):
            log.warning("cudashim: DTensor gives every rank the random state of rank 0, as torch "
                        "does; seed every rank with torch.manual_seed(seed) to keep their own")
        self.generator.set_state(on_device.cpu())


def state_key(generator: torch.Generator) -> bytes:
    """A digest of the generator's whole state: equal states, equal keys."""
    return hashlib.blake2b(generator.get_state().numpy().tobytes(), digest_size=16).digest()


def derived_seed(key: bytes, index: int) -> int:
    """A 64-bit seed for draw ``index`` of the state ``key``."""
    mixed = hashlib.blake2b(key + index.to_bytes(8, "little", signed=True), digest_size=8)
    return int.from_bytes(mixed.digest(), "little")


def shard_index(spec) -> int:
    """The linear index of this rank's shard of the DTensor ``spec``, as torch's tracker
    numbers shards: tensor dimensions in order, each split by its mesh dimensions in the
    order the placements list them. Replicas of one shard share the index."""
    mesh, placements = spec.mesh, spec.placements
    coordinate = mesh.get_coordinate()
    ndim = len(spec.shape)
    index = 0
    for tensor_dim in range(ndim):
        for mesh_dim, placement in enumerate(placements):
            if placement.is_shard() and placement.dim % max(ndim, 1) == tensor_dim:
                index = index * mesh.size(mesh_dim) + coordinate[mesh_dim]
    return index


def _device_of(arguments, target) -> torch.device | None:
    """The device a tracker is made for: the first argument is a DeviceMesh from torch 2.5,
    a device type before (and nothing at all, meaning CUDA)."""
    first = arguments[0] if arguments else "cuda"
    device_type = getattr(first, "device_type", first)
    if device_type == "cuda":
        device_type = target.device_type
    if device_type != target.device_type:
        return None                                   # a mesh the program made on another device
    if device_type == "cpu":
        return torch.device("cpu")
    return torch.device(device_type, getattr(torch, device_type).current_device())


def _generator_of(device: torch.device, target) -> torch.Generator:
    if device.type == "cpu":
        return torch.default_generator
    own = getattr(getattr(torch, device.type, None), "default_generators", None)
    return own[device.index] if own else target.default_generator(device.index)


def _counts_offsets(generator: torch.Generator) -> bool:
    state = generator.get_state()
    return state.dtype == torch.uint8 and state.numel() == _PHILOX_STATE_BYTES


def _initializing(original, target):
    @functools.wraps(original)
    def __init__(self, *args, **kwargs):
        device = _device_of(args or tuple(kwargs.values())[:1], target)
        generator = None if device is None else _generator_of(device, target)
        if generator is None or _counts_offsets(generator):
            self._cudashim_regions = None
            return original(self, *args, **kwargs)
        # torch's own attributes, for the code that reads them (the device, its module, the
        # switch; the device type, its indices and the named states of torch before 2.5)
        self._device, self._device_type, self._devices = device, device.type, [device.index or 0]
        self._device_handle = getattr(torch, device.type)
        self._states, self._use_distribute_region = {}, True
        self._cudashim_regions = SeededRegions(generator, device)
        run_state_sync = kwargs.get("run_state_sync", args[1] if len(args) > 1 else True)
        if run_state_sync and torch.distributed.is_initialized():
            self._cudashim_regions.synchronize()
    return __init__


def _seeding_regions(original):
    @functools.wraps(original)
    def _distribute_region(self, spec, generator=None):
        regions = getattr(self, "_cudashim_regions", None)
        if regions is None:
            return original(self, spec) if generator is None else original(self, spec, generator)
        if not self.distribute_region_enabled:
            return contextlib.nullcontext()
        return regions.region(spec, generator)
    return _distribute_region


def _seeding_the_generator(original):
    @functools.wraps(original)
    def _manual_seed(self, parallel_seed, *args, **kwargs):
        regions = getattr(self, "_cudashim_regions", None)
        if regions is None:
            return original(self, parallel_seed, *args, **kwargs)
        regions.generator.manual_seed(int(parallel_seed))
    return _manual_seed
