"""torch.compile: compiled code hears the same ``is_cuda`` as eager code.

Dynamo does not call ``Tensor.is_cuda`` while it traces; it answers from the device type
(``device.type == "cuda"``). So for the program's own code it is told what the program
hears in eager mode, and torch's code it traces still hears the truth. Dynamo is imported
lazily (it costs a second), so the patch waits for that import when it has not happened.
"""

import wrapt

from ..callers import is_torch_module

DYNAMO_TENSORS = "torch._dynamo.variables.tensor"
# A private dynamo method (and VariableTracker.build, new in torch 2.6) is patched here.
SUPPORTED_TORCH = ("2.6", None)


def install(activation):
    if activation.settings.is_honest("is_cuda"):
        return
    device_type = activation.backend.device_type

    def patch(module):
        if not activation.live:
            return
        TensorVariable = module.TensorVariable
        original = TensorVariable.method_attr_is_cuda

        def method_attr_is_cuda(self, tx):
            device = self.device
            traced_module = tx.f_globals.get("__name__", "")
            if device is not None and device.type == device_type and not is_torch_module(traced_module):
                return module.VariableTracker.build(tx, True)
            return original(self, tx)

        activation.registry.set_attr(TensorVariable, "method_attr_is_cuda", method_attr_is_cuda)

    wrapt.register_post_import_hook(patch, DYNAMO_TENSORS)
