"""Streams, events and device properties for targets without CUDA-style ones.

On the CPU work runs in order as it is issued, and MPS has one command queue, so a stream
is an ordering promise already kept: waits are met, synchronizing is the device's own
synchronize. Events are timed on the host clock: a record waits until the device has
finished the work issued before it (on the CPU it has when the call returns). Accelerators
whose extension has no streams or events of its own (torchvulkan) get these too.
"""

from __future__ import annotations

import abc
import contextlib
import sys
import threading
import time
from typing import NamedTuple, Optional

import torch

from .. import torch_names


class DeviceProperties(NamedTuple):
    """The fields programs read from ``torch.cuda.get_device_properties()``, read-only as
    CUDA's are."""
    name: str
    total_memory: int
    major: int
    minor: int
    multi_processor_count: int
    is_integrated: bool = True
    is_multi_gpu_board: bool = False
    L2_cache_size: int = 0
    warp_size: int = 1
    uuid: str = ""

    def __repr__(self):
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, "
                f"multi_processor_count={self.multi_processor_count})")


def synchronize_device(device_type: str) -> None:
    """Wait for the work issued to ``device_type``; the CPU's is done when issued."""
    if device_type != "cpu":
        torch.get_device_module(device_type).synchronize()


class HostEvent:
    """A CUDA-style event timed on the host clock."""
    device_type = "cpu"                  # the device whose work a record waits for

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        self.enable_timing = enable_timing
        self._recorded_ns: Optional[int] = None
        self.device = torch.device(self.device_type)
        self.event_id = 0

    def record(self, stream=None) -> None:
        synchronize_device(self.device_type)
        self._recorded_ns = time.perf_counter_ns()

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        synchronize_device(self.device_type)

    def wait(self, stream=None) -> None:
        pass

    def elapsed_time(self, end_event: "HostEvent") -> float:
        """Milliseconds between this event and ``end_event``, as CUDA reports them."""
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._recorded_ns is None or end_event._recorded_ns is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._recorded_ns - self._recorded_ns) / 1e6

    def __repr__(self):
        return f"<cudashim HostEvent recorded={self._recorded_ns is not None}>"


class HostStream:
    """A CUDA-style stream where work runs in order, so every wait is already met."""
    device_type = "cpu"
    event_class = HostEvent

    def __init__(self, device=None, priority: int = 0, **kwargs):
        self.device = torch.device(self.device_type)
        self.priority = priority
        self.cuda_stream = self.stream_id = 0
        self.device_index = 0

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        synchronize_device(self.device_type)

    def wait_event(self, event) -> None:
        pass

    def wait_stream(self, stream) -> None:
        pass

    def record_event(self, event=None):
        event = event if event is not None else self.event_class()
        event.record(self)
        return event

    # ``with stream:`` makes it current for the block, as torch's streams do from torch 2.7 on.
    def __enter__(self):
        cuda = sys.modules["torch.cuda"]          # the proxy: the program's current stream
        self._entered_from = getattr(self, "_entered_from", []) + [cuda.current_stream()]
        cuda.set_stream(self)
        return self

    def __exit__(self, *exc):
        sys.modules["torch.cuda"].set_stream(self._entered_from.pop())
        return False

    def __eq__(self, other):
        return isinstance(other, HostStream) and other.device == self.device

    def __hash__(self):
        return 0

    def __repr__(self):
        return f"<cudashim HostStream device={self.device_type}>"


def count_as_torch_streams(stream_class, event_class) -> None:
    """torch before 2.5 has dynamo's device interface accept only streams and events derived
    from its _StreamBase and _EventBase (an assertion when torch._dynamo is imported, with the
    proxy torch.cuda as CUDA's interface): the classes the proxy gives count as such, as CUDA's
    own do. An ABC's registration cannot be withdrawn; it changes nothing but that check."""
    for base, cls in (("torch._streambase._StreamBase", stream_class),
                      ("torch._streambase._EventBase", event_class)):
        abstract = torch_names.get(base, None)
        if isinstance(abstract, abc.ABCMeta) and not issubclass(cls, abstract):
            abstract.register(cls)     # later releases alias torch.Stream and torch.Event


count_as_torch_streams(HostStream, HostEvent)


class CurrentStream(threading.local):
    stream = None              # a class default: a missing attribute would cost an exception


def host_ordered(device_type: str):
    """(Stream, Event) classes for a device whose work runs in issue order and whose
    extension has none of its own."""
    event = type("HostEvent", (HostEvent,), {"device_type": device_type, "__module__": __name__})
    stream = type("HostStream", (HostStream,), {"device_type": device_type, "event_class": event,
                                                "__module__": __name__})
    return stream, event


class HostStreams:
    """The stream and event methods of a backend whose streams are ``HostStream``: one
    default stream, and a current stream per thread."""
    Stream = HostStream
    Event = HostEvent

    def __init__(self, settings):
        super().__init__(settings)
        self._stream_state = CurrentStream()
        self._default_stream = None            # made on first use: MPS's needs the device

    def current_stream(self, index: Optional[int] = None):
        return self._stream_state.stream or self.default_stream(index)

    def default_stream(self, index: Optional[int] = None):
        if self._default_stream is None:
            self._default_stream = self.Stream()
        return self._default_stream

    def set_stream(self, stream) -> None:
        self._stream_state.stream = stream

    @contextlib.contextmanager
    def stream(self, stream):
        state = self._stream_state
        previous = state.stream
        state.stream = stream
        try:
            yield stream
        finally:
            state.stream = previous

