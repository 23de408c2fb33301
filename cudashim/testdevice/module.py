"""``torch.shimdev``: the test accelerator's device module, shaped like ``torch.cuda``.

What torch.accelerator answers for any device comes from it; the rest (generators, device
names, the dtypes autocast may use) from the compiled extension.
"""

from __future__ import annotations

import torch

Stream = torch.Stream
Event = torch.Event


def _ext():
    from . import compiled
    return compiled()


def _index(device=None) -> int:
    if device is None:
        return torch.accelerator.current_device_index()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return torch.accelerator.current_device_index() if device.index is None else device.index


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return _ext().device_count()


def current_device() -> int:
    return torch.accelerator.current_device_index()


def set_device(device) -> None:
    torch.accelerator.set_device_index(_index(device))


def synchronize(device=None) -> None:
    torch.accelerator.synchronize(device)


def _is_in_bad_fork() -> bool:          # nothing of the device lives in driver state
    return False


def get_device_name(device=None) -> str:
    return f"cudashim test accelerator {_index(device)}"


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# --- generators: one per device --------------------------------------------------------
# The module is imported once the devices are made (testdevice.load).
default_generators = tuple(_ext().default_generator(i) for i in range(_ext().device_count()))


def manual_seed(seed: int) -> None:
    _ext().default_generator(current_device()).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for generator in default_generators:
        generator.manual_seed(int(seed))


def seed() -> None:
    _ext().default_generator(current_device()).seed()


def seed_all() -> None:
    first = _ext().default_generator(0).seed()
    for generator in default_generators[1:]:
        generator.manual_seed(first)


def initial_seed() -> int:
    return _ext().default_generator(current_device()).initial_seed()


def get_rng_state(device="shimdev") -> torch.Tensor:
    return _ext().default_generator(_index(device)).get_state()


def set_rng_state(new_state: torch.Tensor, device="shimdev") -> None:
    _ext().default_generator(_index(device)).set_state(new_state)


def get_rng_state_all():
    return [generator.get_state() for generator in default_generators]


def set_rng_state_all(new_states) -> None:
    for generator, state in zip(default_generators, new_states):
        generator.set_state(state)


# --- streams ----------------------------------------------------------------------------
def current_stream(device=None) -> torch.Stream:
    return torch.accelerator.current_stream(_index(device))


def default_stream(device=None) -> torch.Stream:
    index = _index(device)
    device_type = torch.accelerator.current_stream(index).device_type
    return torch.Stream(stream_id=0, device_index=index, device_type=device_type)


def set_stream(stream: torch.Stream) -> None:
    torch.accelerator.set_stream(stream)


# --- memory -----------------------------------------------------------------------------
def memory_allocated(device=None) -> int:
    return torch.accelerator.memory_allocated(_index(device))


def max_memory_allocated(device=None) -> int:
    return torch.accelerator.max_memory_allocated(_index(device))


def memory_reserved(device=None) -> int:
    return torch.accelerator.memory_reserved(_index(device))


def max_memory_reserved(device=None) -> int:
    return torch.accelerator.max_memory_reserved(_index(device))


def memory_stats(device=None) -> dict:
    return torch.accelerator.memory_stats(_index(device))


def reset_peak_memory_stats(device=None) -> None:
    torch.accelerator.reset_peak_memory_stats(_index(device))


def mem_get_info(device=None):
    return torch.accelerator.get_memory_info(_index(device))


def empty_cache() -> None:
    torch.accelerator.empty_cache()


def host_readable(tensor: torch.Tensor) -> bool:
    """Whether the host may touch the tensor's memory now: for device tensors, only while
    one of the device's kernels runs."""
    return _ext().host_readable(tensor)
