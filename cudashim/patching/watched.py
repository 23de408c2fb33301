"""An object's attributes as the program sees them, with each write also heard elsewhere."""


class WatchedAttributes:
    """Every attribute is ``real``'s; after each write, ``written(name, value)`` is called
    (``torch.backends.cuda.matmul``: TF32 mapped to the target, writes counted)."""

    def __init__(self, real, written):
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_written", written)

    def __getattr__(self, name):
        return getattr(self._real, name)

    def __setattr__(self, name, value):
        setattr(self._real, name, value)
        self._written(name, value)
