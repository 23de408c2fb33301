"""``nn.parallel.parallel_apply`` on the target: one thread per replica, as on CUDA.

Each thread runs its replica with its CUDA index as the current device, on that device's
current stream (taken in the calling thread, as torch does), with the caller's grad mode and
autocast state. The autocast dtype travels too: a replica of ``autocast(dtype=torch.bfloat16)``
computes in bfloat16, where torch's own threads would fall back to the device's default.
A replica's exception is raised again in the caller, naming the replica and its device.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Optional, Sequence

import torch
from torch._utils import ExceptionWrapper
from torch.nn.parallel.parallel_apply import get_a_var

from .comm import DeviceComm


@contextlib.contextmanager
def current_device(backend, index: int):
    """``index`` as the current CUDA device of this thread while the block runs."""
    previous = backend.current_device()
    backend.set_device(index)
    try:
        yield
    finally:
        backend.set_device(previous)


def parallel_apply_for(comm: DeviceComm):
    """torch's ``parallel_apply(modules, inputs, kwargs_tup=None, devices=None)`` over ``comm``."""
    backend = comm.backend
    device_type = backend.device_type

    def parallel_apply(modules: Sequence[torch.nn.Module], inputs: Sequence[Any],
                       kwargs_tup: Optional[Sequence[dict]] = None,
                       devices: Optional[Sequence[Any]] = None) -> list:
        if len(modules) != len(inputs):
            raise AssertionError(f"The number of modules {len(modules)} is not equal to the number "
                                 f"of inputs {len(inputs)}")
        if kwargs_tup is None:
            kwargs_tup = ({},) * len(modules)
        elif len(modules) != len(kwargs_tup):
            raise AssertionError(f"The number of modules {len(modules)} is not equal to the number "
                                 f"of kwargs_tup {len(kwargs_tup)}")
        if devices is None:
            devices = [None] * len(modules)
        elif len(modules) != len(devices):
            raise AssertionError(f"The number of modules {len(modules)} is not equal to the number "
                                 f"of devices {len(devices)}")
        indices = [None if d is None else comm.index(d) for d in devices]
        streams = [None if i is None else backend.current_stream(i) for i in indices]
        grad_enabled = torch.is_grad_enabled()
        autocast = (torch.is_autocast_enabled(device_type), torch.get_autocast_dtype(device_type))
        lock, results = threading.Lock(), {}

        def run(i, module, input, kwargs, index, stream):
            torch.set_grad_enabled(grad_enabled)
            if index is None:
                tensor = get_a_var(input)
                if tensor is None:
                    with lock:
                        results[i] = ExceptionWrapper(
                            where=f"in replica {i}, no device was provided and no tensor input "
                                  "was found; device cannot be resolved")
                    return
                index = comm.index_of(tensor)
            try:
                if stream is None:
                    stream = backend.current_stream(index)
                with current_device(backend, index), backend.stream(stream), \
                        torch.autocast(device_type, dtype=autocast[1], enabled=autocast[0]):
                    output = module(*(input if isinstance(input, (list, tuple)) else (input,)), **kwargs)
                with lock:
                    results[i] = output
            except Exception:
                with lock:
                    results[i] = ExceptionWrapper(where=f"in replica {i} on device {index}")

        work = list(zip(modules, inputs, kwargs_tup, indices, streams))
        if len(work) > 1:
            threads = [threading.Thread(target=run, args=(i, *w), name=f"replica {i}")
                       for i, w in enumerate(work)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        else:
            run(0, *work[0])
        outputs = []
        for i in range(len(inputs)):
            output = results[i]
            if isinstance(output, ExceptionWrapper):
                output.reraise()
            outputs.append(output)
        return outputs

    parallel_apply.__module__ = "torch.nn.parallel.parallel_apply"
    parallel_apply.__qualname__ = parallel_apply.__name__
    return parallel_apply
