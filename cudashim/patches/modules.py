"""nn.Module.to and to_empty; Module.cuda calls Tensor.cuda, which is patched already."""

from ..patching.rewriter import DEVICE, rewrite

REWRITES = (
    # Module.to(self, *args, **kwargs): the device, when given, is the first positional.
    rewrite("torch.nn:Module.to", DEVICE, position=1),
    rewrite("torch.nn:Module.to_empty", DEVICE),
)
