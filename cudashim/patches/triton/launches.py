"""Launches of ``@triton.jit`` kernels, run through Triton's interpreter.

Triton decides at decoration time whether a kernel is interpreted (``TRITON_INTERPRET=1``), and
libraries decorate theirs when they are imported, so a variable set by cudashim would come too
late for some and would change every kernel of the process for good. Here each launch decides:
``JITFunction.run`` (what ``kernel[grid](...)``, autotuners and heuristics call) runs the
kernel's interpreted twin, made once per kernel. Around it, what the interpreter lacks is made
good:

- the grid: a callable grid gets the bound arguments as CUDA's launcher gives them (Python
  ints, the config's constants), not the interpreter's wrapped scalars;
- float arguments: the interpreter passes them on as Python floats, which have no ``.to()``;
  CUDA's launcher makes them float32 scalars;
- calls of other ``@triton.jit`` functions inside a kernel (the kernel's helpers,
  ``tl.sum``, ``tl.softmax``, which ``triton.language`` defines with ``@jit``) run their
  interpreted twins, as they would under ``TRITON_INTERPRET``;
- autotuning: timing configs means running each one interpreted, so the autotuner runs the
  first config its pruning keeps;
- ``kernel.warmup(...)``: returns a compiled kernel's stand-in with the numbers libraries read
  (registers, spills, shared memory) and a launch, ``compiled[grid](*args)``.

The interpreter is one process-wide state (the grid position), so launches take turns. A
kernel the interpreter cannot run (inline PTX, an extern function it has no numpy twin for)
fails with one refusal naming it, a RuntimeError, as a launch that finds no driver fails; its
cause is chained.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import sys
import threading
import time
import weakref
from types import SimpleNamespace

from ...errors import UnsupportedCudaAPI, refusal
from ...graphs import graph
from . import bfloat16, gaps, libdevice

# (module, attribute) of the Triton internals this needs; Triton 3.0 to 3.8 have each.
NEEDED = (
    ("triton.runtime.jit", "JITFunction"),
    ("triton.runtime.autotuner", "Autotuner"),
    ("triton.runtime.interpreter", "InterpretedFunction"),
    ("triton.runtime.interpreter", "_implicit_cvt"),
    ("triton.runtime.interpreter", "TensorHandle"),
    ("triton.runtime.interpreter", "_patch_lang_tensor"),
    ("triton.runtime.interpreter", "_get_np_dtype"),
    ("triton.runtime.interpreter", "InterpreterBuilder"),
    ("triton.runtime.interpreter", "_interpreter"),
)


class Interpreter:
    """Triton's interpreter, as the launches use it."""

    @staticmethod
    def lacking() -> str:
        """The first internal this Triton lacks, as 'module.name', or ''."""
        import importlib
        for module_name, name in NEEDED:
            try:
                module = importlib.import_module(module_name)
            except ImportError:
                return module_name
            if not hasattr(module, name):
                return f"{module_name}.{name}"
        return ""


class Launches:
    """The interpreted twins of one activation's kernels, and the launches through them."""

    def __init__(self, activation):
        from triton.runtime.interpreter import InterpretedFunction
        self.activation = activation
        self.target = activation.backend.name               # the backend, as refusals name it
        self.device_type = activation.backend.device_type   # where the report says they ran
        self._interpreted_function = InterpretedFunction
        self._twins = weakref.WeakKeyDictionary()     # the kernel's Python function -> twin
        self._turn = threading.RLock()                # the interpreter's grid position is global
        self._inside = threading.local()              # depth of launches on this thread
        self._patched_modules = set()                 # libdevice modules pointed at numpy

    # --- the twins --------------------------------------------------------------------
    def twin(self, kernel):
        fn = kernel.fn
        twin = self._twins.get(fn)
        if twin is None:
            self.interpret_libdevice(fn.__globals__)
            twin = self._twins[fn] = self._interpreted_function(fn)
        return twin

    def interpret_libdevice(self, namespace: dict) -> None:
        """Point the libdevice functions a kernel's module reaches, by name or through the
        module, at their interpreted twins (``libdevice.py``), while the activation lives."""
        registry = self.activation.registry
        for name, value in list(namespace.items()):
            if inspect.ismodule(value) and libdevice.is_libdevice_module(value.__name__):
                if value not in self._patched_modules:
                    self._patched_modules.add(value)
                    for function in libdevice.NAMES & set(vars(value)):
                        registry.set_attr(value, function, libdevice.function(function))
            elif (callable(value) and libdevice.is_libdevice_module(getattr(value, "__module__", "") or "")
                    and getattr(value, "__name__", None) in libdevice.NAMES):
                registry.set_item(namespace, name, libdevice.function(value.__name__))

    def inside_a_kernel(self) -> bool:
        return getattr(self._inside, "depth", 0) > 0

    # --- a launch ---------------------------------------------------------------------
    def launch(self, kernel, args, kwargs, grid):
        recording = graph.recording_here()
        if recording is None:
            self.run(*self.prepared(kernel, args, kwargs, grid))
            return
        # Inside a CUDA graph's capture: the probe and the grid are no work of the graph's, and
        # the launch is recorded as one step, run at every replay (not now: CUDA's capture runs
        # nothing).
        import torch
        from ...graphs.recording import OpaqueWork    # imported at the first capture, as the recorder
        with recording.unrecorded():
            prepared = self.prepared(kernel, args, kwargs, grid)
        tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
        recording.record_opaque(OpaqueWork(f"the Triton kernel {prepared[0]}", lambda: self.run(*prepared)),
                                tensors)

    def prepared(self, kernel, args, kwargs, grid):
        """The arguments of ``run`` for a launch: the kernel's name, its interpreted twin, the
        launch's arguments and its grid as ints; refused where the interpreter cannot store."""
        name = kernel_name(kernel)
        broken = gaps.store_works()
        if broken:
            raise refusal(UnsupportedCudaAPI(f"the Triton kernel {name}", self.target,
                                             f"it would run through Triton's interpreter, but {broken}"))
        return name, self.twin(kernel), args, kwargs, launch_grid(kernel, grid, args, kwargs)

    def run(self, name, twin, args, kwargs, grid) -> None:
        """The kernel's interpreted twin run over ``grid``, counted in the report."""
        start = time.perf_counter()
        # The interpreter copies each argument's whole storage to the host and back; where device
        # memory is host memory (``Residency``), it works on the storages themselves.
        residency = self.activation.residency
        with self._turn, (residency.in_place() if residency is not None else contextlib.nullcontext()):
            self._inside.depth = getattr(self._inside, "depth", 0) + 1
            try:
                twin.run(*args, grid=grid, warmup=False, **kwargs)
            except Exception as error:
                raise self.cannot_run(name, error) from error
            finally:
                self._inside.depth -= 1
        self.counted(name, time.perf_counter() - start)

    def call_inside(self, kernel, args, kwargs):
        """A ``@triton.jit`` function called by a kernel being interpreted."""
        return self.twin(kernel)(*args, **kwargs)

    def cannot_run(self, name: str, error: Exception) -> Exception:
        cause = error.__cause__ if error.__cause__ is not None else error
        return refusal(UnsupportedCudaAPI(
            f"the Triton kernel {name}", self.target,
            f"it runs through Triton's interpreter here, which cannot run it "
            f"({type(cause).__name__}: {cause})"))

    def counted(self, name: str, seconds: float) -> None:
        report = self.activation.report
        if report is not None:
            report.interpreted(name, self.device_type, seconds)


def kernel_name(kernel) -> str:
    fn = kernel.fn
    return f"{fn.__module__}.{fn.__qualname__}"


def launch_grid(kernel, grid, args, kwargs):
    """The grid as a tuple of ints. A callable grid gets the kernel's bound arguments, with its
    defaults and the launch's other keywords (a config's constants), as CUDA's launcher calls it."""
    if callable(grid):
        parameters = inspect.signature(kernel.fn).parameters
        bound = inspect.signature(kernel.fn).bind_partial(
            *args, **{key: value for key, value in kwargs.items() if key in parameters})
        bound.apply_defaults()
        grid = grid({**kwargs, **bound.arguments})
    return tuple(int(size) for size in grid)


# --- what the patches put in Triton's place ----------------------------------------------
def _running(launches):
    def run(original):
        def launch_or_warm_up(kernel, args, kwargs, grid, warmup):
            if warmup:
                return CompiledStandIn(launches, kernel, kwargs)
            return launches.launch(kernel, args, kwargs, grid)

        # torch.compile of code that launches a kernel: dynamo runs the launch as it is, between
        # graphs, as it runs any call it cannot trace (it knows Triton kernels only on a GPU).
        # Marked at the first launch, not here: torch._dynamo itself imports triton, and this
        # patch is made while it does.
        untraced = []

        @functools.wraps(original)
        def interpreted_run(self, *args, grid, warmup, **kwargs):
            if not untraced:
                if "torch._dynamo" not in sys.modules:
                    # Nothing compiles before dynamo is imported, and its import runs ops on
                    # tensors (torch 2.7 reads one on the host), which a CUDA graph's capture in
                    # progress refuses: the first launch inside one was that import.
                    return launch_or_warm_up(self, args, kwargs, grid, warmup)
                import torch
                untraced.append(torch.compiler.disable(launch_or_warm_up))
            return untraced[0](self, args, kwargs, grid, warmup)
        return interpreted_run
    return run


def _calling(launches):
    def call(original):
        @functools.wraps(original)
        def interpreted_call(self, *args, **kwargs):
            if launches.inside_a_kernel():
                return launches.call_inside(self, args, kwargs)
            return original(self, *args, **kwargs)
        return interpreted_call
    return call


def _tuning_one_config(original):
    @functools.wraps(original)
    def run_one_config(self, *args, **kwargs):
        if len(self.configs) <= 1:
            return original(self, *args, **kwargs)
        self.nargs = dict(zip(self.arg_names, args))
        first = self.prune_configs(kwargs)[0]
        configs, self.configs = self.configs, [first]
        try:
            return original(self, *args, **kwargs)
        finally:
            self.configs = configs
    return run_one_config


class CompiledStandIn:
    """What ``kernel.warmup(...)`` returns on CUDA, for a kernel that is never compiled: the
    numbers libraries read to size a persistent grid, and ``compiled[grid](*args)``."""

    n_regs = 32                 # the fewest a kernel takes: occupancy is bounded by the rest
    n_spills = 0
    n_max_threads = 1024

    def __init__(self, launches, kernel, options):
        self._launches, self._kernel = launches, kernel
        self.name = kernel.fn.__name__
        num_warps = options.get("num_warps", 4)
        # Libraries divide the device's shared memory by this: one word per warp is the least
        # a kernel that reduces across warps takes.
        self.metadata = SimpleNamespace(name=self.name, num_warps=num_warps,
                                        num_stages=options.get("num_stages", 3),
                                        shared=4 * num_warps)
        self.packed_metadata = self.metadata
        self.asm = {}

    def _init_handles(self) -> None:
        """Nothing to load: the kernel runs interpreted."""

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            kwargs.pop("stream", None)
            return self._launches.launch(self._kernel, args, kwargs, grid)
        return launch


def install(activation) -> None:
    from triton.runtime import interpreter
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.jit import JITFunction

    launches = Launches(activation)
    activation.replace(JITFunction, "run", _running(launches))
    activation.replace(JITFunction, "__call__", _calling(launches))
    activation.replace(Autotuner, "run", _tuning_one_config)
    activation.replace(interpreter, "_implicit_cvt", gaps.float_scalars(interpreter.TensorHandle))
    activation.replace(interpreter, "_patch_lang_tensor", gaps.indexable_scalars)
    transformer = getattr(interpreter, "ASTTransformer", None)     # Triton 3.3 and later
    if transformer is not None and "visit_For" not in vars(transformer):
        activation.registry.add_attr(transformer, "visit_For", gaps.visit_for)
        # Kernels rewritten meanwhile are cached by the interpreter: forget them on the way out.
        rewritten = getattr(interpreter.InterpretedFunction, "rewritten_fn", None)
        if isinstance(rewritten, dict):
            before = set(rewritten)
            activation.registry.add_undo("Triton kernels rewritten under cudashim", lambda: [
                rewritten.pop(fn) for fn in set(rewritten) - before])
    bfloat16.install(activation, interpreter)
