"""Triton kernels written for CUDA: on the target's own Triton backend, else interpreted.

Libraries send CUDA tensors to their own ``@triton.jit`` kernels when ``x.is_cuda`` (Liger's
fused RMSNorm, cross-entropy and SwiGLU, flash-linear-attention, xformers' Triton kernels,
``torch.library.triton_op``). Under cudashim ``is_cuda`` is True, and Triton, which hears the
truth, finds no CUDA driver: ``RuntimeError: 0 active drivers ([]). There should only be one.``

Where the target has a Triton backend of its own (Intel's for XPU, triton-ascend for NPU),
Triton picks it from the truth and the launches go there: nothing is patched. Elsewhere (the
CPU, the test accelerator, torchvulkan, MPS) every launch runs through Triton's interpreter, with
what the interpreter lacks made good (``launches.py``): the launch grid computed from the
arguments as CUDA's launcher computes it, float arguments as the float32 scalars CUDA passes,
helper kernels and ``triton.language``'s own ``@jit`` functions interpreted with their caller,
autotuning reduced to one config, ``.warmup()``'s compiled kernel and its launch. Libraries'
``triton.runtime.driver.active`` queries are answered for the CUDA device the program sees
(``driver.py``). A kernel the interpreter still cannot run fails with one refusal naming it, a
RuntimeError, so a library's own fallback takes over. The report counts the kernels that ran
interpreted and the time they took.
"""

from __future__ import annotations

import logging

from ...errors import warn_once

log = logging.getLogger(__name__)

# Triton's backends for CUDA devices: the ones that cannot serve another target.
CUDA_BACKENDS = ("nvidia", "amd")


def install(activation) -> None:
    if not activation.backend.redirects:           # real CUDA: Triton's own driver serves it
        return
    activation.when_imported("triton", lambda triton: _serve(activation, triton))


def own_backend(triton) -> str:
    """The name of a Triton backend that compiles for the target (one other than CUDA's whose
    driver says it is active), or ''."""
    backends = getattr(getattr(triton, "backends", None), "backends", None) or {}
    for name, backend in backends.items():
        if name in CUDA_BACKENDS:
            continue
        try:
            if backend.driver.is_active():
                return name
        except Exception as error:          # a vendor's driver that cannot even answer
            log.debug("cudashim: Triton's %s backend does not answer is_active(): %s", name, error)
    return ""


def describe(backend) -> str:
    """Where a Triton kernel's launch goes on ``backend`` (``cudashim doctor``)."""
    import importlib.util
    if importlib.util.find_spec("triton") is None:
        return "triton not installed"
    import triton
    version = f"triton {getattr(triton, '__version__', '?')}"
    if not backend.redirects:
        return f"{version}: native CUDA"
    name = own_backend(triton)
    if name:
        return f"{version}: Triton's {name} backend compiles them for the {backend.device_type} device"
    from . import gaps, launches
    missing = launches.Interpreter.lacking()
    if missing:
        return f"{version}: cannot run here (this triton has no {missing})"
    refused = gaps.store_works()
    if refused:
        return f"{version}: refused: {refused}"
    return (f"{version}: no Triton backend for the {backend.device_type} device: each launch runs through "
            "Triton's interpreter, one program at a time (slow; --report times each kernel)")


def _serve(activation, triton) -> None:
    backend = activation.backend
    name = own_backend(triton)
    if name:
        log.info("cudashim: Triton kernels go to Triton's %s backend for %s", name, backend.name)
        return
    from . import driver, launches

    missing = launches.Interpreter.lacking()
    if missing:
        warn_once("triton-interpreter",
                  f"cudashim cannot run Triton kernels on {backend.name}: triton "
                  f"{getattr(triton, '__version__', '?')} has no {missing}; a launch fails as "
                  "Triton fails without a driver")
        return
    done = len(activation.registry)
    try:
        driver.install(activation)
        launches.install(activation)
    except Exception:               # all of it or none: a driver without its launches breaks both
        activation.registry.revert_to(done)
        raise
