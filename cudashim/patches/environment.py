"""CUDA_VISIBLE_DEVICES becomes the vendor's variable, unless that one is already set.

On the CPU the backend reads CUDA_VISIBLE_DEVICES itself to size its virtual devices.
"""

import os


def install(activation):
    var = activation.backend.visible_devices_var
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if var and visible is not None and var not in os.environ:
        activation.registry.set_item(os.environ, var, visible)
