"""Hugging Face's kernels library (the Hub's kernels) on a target it does not name.

transformers (5.25 on, which requires kernels) kernelizes every model ``from_pretrained``
loads, naming the device type the model is on: kernels swaps in the Hub's kernels for that
type, and where the Hub has none a layer keeps its own forward (the fallback transformers asks
for). kernels takes the device type it finds on a model's parameters as it is, but refuses a
type named as a string outside its list (cpu, cuda, mps, neuron, npu, rocm, tpu, xpu). So a
CUDA program loading a model onto its GPU (``device_map={"": 0}``, ``device_map="cuda"``) on a
target registered under another name (an accelerator of torch's PrivateUse1 key) would stop in
``from_pretrained``: "Unsupported device type". Under cudashim the target's own type passes
that check as the type found on parameters would; the Hub has no kernels for it, so every
layer keeps its own forward, which cudashim runs on the target.
"""

from __future__ import annotations

import wrapt

KERNELIZE = "kernels._internals.layer.kernelize"
CHECK = "_validate_device_type"


def install(activation) -> None:
    target_type = activation.backend.device_type

    def accept_the_targets_type(module):
        @wrapt.decorator
        def check(wrapped, _instance, args, kwargs):
            device_type = args[0] if args else kwargs.get("device_type")
            if device_type == target_type:
                return None
            return wrapped(*args, **kwargs)

        # kernels' own check, read where kernelize calls it; a release without it refuses nothing
        activation.replace(module, CHECK, check)

    activation.when_imported(KERNELIZE, accept_the_targets_type)
