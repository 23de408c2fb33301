"""torch.load: storages saved on ``cuda:N`` load onto the target, in every map_location form.

Through torch's own hook for it (``torch.serialization.register_package``): a deserializer,
tried before CUDA's, restores a storage whose location names CUDA onto the target device.
Every form of map_location reaches it (none, a device spec, a dict of tags, a function that
returns None), in ``torch.load`` and ``torch.package`` alike, because torch hands each of
them to its registered deserializers.

Saving needs nothing: tensors live on the target, so files carry the target's tags and load
with plain PyTorch anywhere.
"""

import torch.serialization

# Tried in ascending order; CUDA's deserializer is 20 and refuses without CUDA.
PRIORITY = 19



def install(activation):
    translate = activation.translator.for_api("torch.load")
    restore = torch.serialization.default_restore_location

    def cuda_onto_the_target(storage, location: str):
        if not location.startswith("cuda"):
            return None                  # every other tag is torch's own business
        target = str(translate(location))    # parsed as a device spec, never as a substring
        return restore(storage, target)

    entry = (PRIORITY, lambda storage: None, cuda_onto_the_target)
    torch.serialization.register_package(*entry)
    # torch offers no way to unregister: deactivation takes the entry out of its list.
    registry = torch.serialization._package_registry
    activation.registry.add_undo("the deserializer for CUDA-tagged storages",
                                 lambda: entry in registry and registry.remove(entry))
