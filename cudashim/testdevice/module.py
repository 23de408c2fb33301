"""``torch.shimdev``: the test accelerator's device module, shaped like ``torch.cuda``.

Every answer comes from the compiled extension, not through ``torch.accelerator``: torch
before 2.6 has none, before 2.9 it has no memory functions, and on a CUDA build it answers
for CUDA (the build's accelerator), not for this device.
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
        return _ext().current_device()
    if isinstance(device, int):
        return device
    device = torch.device(device)
    return _ext().current_device() if device.index is None else device.index


def is_available() -> bool:
    return device_count() > 0


def device_count() -> int:
    return _ext().device_count()


def current_device() -> int:
    return _ext().current_device()


def set_device(device) -> None:
    _ext().set_device(_index(device))


def synchronize(device=None) -> None:
    _ext().current_stream(_index(device))       # checks the index; work is done when issued


def _is_in_bad_fork() -> bool:          # nothing of the device lives in driver state
    return False


def get_device_name(device=None) -> str:
    return f"cudashim test accelerator {_index(device)}"


def get_amp_supported_dtype():
    return [torch.float16, torch.bfloat16]


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return True


# Its kernels are torch's CPU kernels run on its memory: reduced-precision dtypes are as fast
# as the host computes them (cudashim's precision policy reads this), long reductions as inexact.
computes_with_host_kernels = True


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
    return _ext().current_stream(_index(device))


def default_stream(device=None) -> torch.Stream:
    index = _index(device)
    device_type = _ext().current_stream(index).device_type
    return torch.Stream(stream_id=0, device_index=index, device_type=device_type)


def set_stream(stream: torch.Stream) -> None:
    _ext().set_stream(stream.stream_id, stream.device_index)


# --- memory -----------------------------------------------------------------------------
def memory_stats(device=None) -> dict:
    return _ext().memory_stats(_index(device))


def memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    return memory_stats(device)["allocated_bytes.all.peak"]


def memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    return memory_stats(device)["reserved_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    _ext().reset_peak_stats(_index(device))


def mem_get_info(device=None):
    return _ext().memory_info(_index(device))


def empty_cache() -> None:
    """Unmap the freed memory the device keeps for reuse (``memory_reserved`` drops to
    ``memory_allocated``), as torch.cuda.empty_cache() releases the caching allocator's."""
    _ext().empty_cache()


def host_readable(tensor: torch.Tensor) -> bool:
    """Whether the host may touch the tensor's memory now: for device tensors, only while
    one of the device's kernels runs."""
    return _ext().host_readable(tensor)
