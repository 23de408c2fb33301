"""torch.load: storages saved on ``cuda:N`` load onto the target, in every map_location form.

Through torch's own hook for it (``torch.serialization.register_package``): a deserializer,
tried before CUDA's, restores a storage whose location names CUDA onto the target device.
Every form of map_location reaches it (none, a device spec, a dict of tags, a function that
returns None), in ``torch.load`` and ``torch.package`` alike, because torch hands each of
them to its registered deserializers.

Saving needs nothing: tensors live on the target, so files carry the target's tags and load
with plain PyTorch anywhere.

Where device memory is host memory (the CPU backend), what loads onto the device is device
memory, as a checkpoint read with ``map_location="cuda"`` is on CUDA: each storage restored there
is counted (``activation.placing``), so ``memory_allocated()`` grows by it and a device read off
a loaded tensor names the device. torch turns a ``torch.device`` map_location into its string,
which for the target's device object is the host's ("cpu"); the load is handed "cuda" instead,
which this deserializer restores onto the target.
"""

import functools

import torch.serialization

from ..residency import _viewing

# Tried in ascending order; CUDA's deserializer is 20 and refuses without CUDA.
PRIORITY = 19



def install(activation):
    translate = activation.translator.for_api("torch.load")
    restore = torch.serialization.default_restore_location

    placing = activation.placing if activation.residency is not None else None
    device_object, count = placing[:2] if placing is not None else (None, None)

    def cuda_onto_the_target(storage, location: str):
        if not location.startswith("cuda"):
            return None                  # every other tag is torch's own business
        target = translate(location)     # parsed as a device spec, never as a substring
        restored = restore(storage, str(target))
        if target is device_object:
            count(_viewing(restored))
        return restored

    entry = (PRIORITY, lambda storage: None, cuda_onto_the_target)
    torch.serialization.register_package(*entry)
    # torch offers no way to unregister: deactivation takes the entry out of its list.
    registry = torch.serialization._package_registry
    activation.registry.add_undo("the deserializer for CUDA-tagged storages",
                                 lambda: entry in registry and registry.remove(entry))
    if device_object is not None:
        _load_onto_the_device_by_its_object(activation, device_object)


def _load_onto_the_device_by_its_object(activation, device_object):
    """``torch.load(f, map_location=torch.device("cuda"))``, or a device read off a tensor on the
    device (``map_location=model.device``): torch would restore onto ``str(device)``, the host's
    "cpu"; the load is handed "cuda", which the deserializer above restores onto the target."""
    def make(original):
        @functools.wraps(original)
        def load(f, *args, **kwargs):
            if args and args[0] is device_object:
                args = ("cuda", *args[1:])
            elif kwargs.get("map_location") is device_object:
                kwargs["map_location"] = "cuda"
            return original(f, *args, **kwargs)
        return load

    for owner in (torch, torch.serialization):
        activation.replace(owner, "load", make)
