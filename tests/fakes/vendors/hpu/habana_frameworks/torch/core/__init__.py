"""habana_frameworks.torch.core: lazy-mode graph boundaries, which eager fakes do not need."""


def mark_step():
    pass
