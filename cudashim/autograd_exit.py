"""At exit, the autograd engine's device threads let go of the program's last backward first.

torch runs the backward of a device's ops on a thread of its own, one per device index. When
a backward completes there, that thread wakes the caller and only then drops its own
reference to the backward's state. That state holds Python objects: the caller's torch
function modes (``torch.set_default_device("cuda")``, ``with torch.device(...)``), tensor hooks,
custom ``autograd.Function`` nodes, and, in recent releases, a copy of the caller's
``contextvars`` that every backward stashes. Where the caller's reference goes first, the
device thread frees those objects, and freeing a Python object needs the GIL. A program that
ends right after its last backward (``loss.backward(); optimizer.step()``, then the end of
the script) reaches interpreter finalisation before that thread is scheduled when the machine
is busy; CPython then stops the thread with a forced unwind that torch's C++ destructor cannot
pass: ``terminate called without an active exception``, SIGABRT, and the program's exit status
is lost. It is torch's own race, on CUDA too; on the CPU backend no device thread exists.

So at exit, while the interpreter is whole, cudashim runs one more backward on each device the
program used and waits for it with the GIL released. A device thread takes its tasks one after
another and lets go of each backward's state before it takes the next, so once this backward
has run there, the thread has freed the program's. This backward itself leaves nothing for
the GIL in its state: it runs with the caller's function modes and stashed objects set aside,
hands no gradient back to Python, and its tensors are kept for the rest of the process (a few
scalars per device), so the thread never drops the last reference to anything Python holds.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import logging
import os

from . import torch_names

log = logging.getLogger(__name__)

_kept: list = []        # the tensors of every drain, kept for good (see the module's docstring)


def arm(activation) -> None:
    """Drain the target's autograd threads when the interpreter exits, or at deactivation."""
    backend = activation.backend
    if backend.device_type == "cpu":        # a host backward runs on the caller's own thread
        return
    drain = functools.partial(drain_device_threads, backend, os.getpid())

    def drain_now_instead():                # a program may end right after it deactivates
        atexit.unregister(drain)
        drain()

    atexit.register(drain)
    activation.registry.add_undo("atexit: the autograd device threads let go of the last backward",
                                 drain_now_instead)


def drain_device_threads(backend, pid: int) -> None:
    """One backward on each device the program used, returned once each device's thread ran it.
    Not in a forked child (``pid`` is the process that armed it): no thread is forked with it."""
    import torch

    if os.getpid() != pid:
        return
    try:
        devices = devices_used(backend)
        with _python_state_set_aside(torch):
            for device in devices:      # one root each: several would share a node holding their gradients
                leaf = torch.zeros((), device=device, requires_grad=True)
                root, grad = leaf * 1.0, torch.ones((), device=device)   # a node the device's thread runs
                _keep((leaf, root, grad))
                # Not torch.autograd.backward, which would stash this thread's contextvars in the
                # backward's state; and into the leaf's .grad, where the thread made it: a
                # gradient handed back to Python would stay in that state too.
                torch._C._ImperativeEngine().run_backward((root,), (grad,), False, False, (), True, True)
    except Exception as exc:               # a device in a failed state: exit as the program would
        log.debug("cudashim: the autograd device threads were not drained at exit: %s", exc)


def _keep(tensors) -> None:
    if not _kept:
        import ctypes
        ctypes.pythonapi.Py_IncRef(ctypes.py_object(_kept))     # not even finalisation frees them
    _kept.append(tensors)


def devices_used(backend) -> list:
    """The devices that have held the program's memory: only their threads can hold a backward.
    Where a device keeps no figures, the current device; none where the device module says its
    runtime never started (reading a figure would start it)."""
    is_initialized = getattr(backend.device_module(), "is_initialized", None)
    if is_initialized is not None and not is_initialized():
        return []
    devices = []
    for index in range(backend.device_count()):
        device = backend.target_device(index)
        if device in devices:               # logical devices sharing one real device
            continue
        try:
            used = backend.memory_allocated(index) > 0 or backend.max_memory_allocated(index) > 0
        except Exception:
            used = index == backend.current_device()
        if used:
            devices.append(device)
    return devices


@contextlib.contextmanager
def _python_state_set_aside(torch):
    """This thread's torch state without the Python objects a backward copies into its own:
    the torch function modes (restored after) and the stashed ``contextvars``."""
    is_key_in_tls = torch_names.get("torch._C._is_key_in_tls", None)
    remove_from_tls = torch_names.get("torch._C._remove_obj_from_tls", None)
    if is_key_in_tls is not None and remove_from_tls is not None and is_key_in_tls("context"):
        remove_from_tls("context")          # left there by releases that do not erase it after a backward
    modes = [torch._C._pop_torch_function_stack() for _ in range(torch._C._len_torch_function_stack())]
    try:
        yield
    finally:
        for mode in reversed(modes):
            torch._C._push_on_torch_function_stack(mode)
