"""torch.load: storages saved on ``cuda:N`` load onto the target, in every map_location form.

Saving needs nothing: tensors live on the target, so files carry the target's tags and load
with plain PyTorch anywhere.
"""

from .rewriter import MAP_LOCATION, rewrite

REWRITES = (
    # No map_location at all still needs one: storages tagged "cuda:N" go to the target.
    rewrite("torch:load", MAP_LOCATION, parameter="map_location", missing=None),
    rewrite("torch.package.package_importer:PackageImporter.load_pickle", MAP_LOCATION,
            parameter="map_location", missing=None, api="PackageImporter.load_pickle"),
)
