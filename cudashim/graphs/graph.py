"""``torch.cuda.CUDAGraph``, ``torch.cuda.graph`` and graph pools, on a recording.

``graphs_for(backend)`` makes the classes for one activation's backend. What CUDA's graphs
promise and how it is kept:

- capture begins and ends on the calling thread (``capture_begin``/``capture_end``, or the
  ``graph`` context); ops run on other threads are not captured, as with
  ``capture_error_mode="thread_local"``;
- a graph's memory lives as long as the graph (``reset()`` or the graph's end frees it);
  graphs that share a pool (``pool=``) are not packed into the same memory, which is what
  sharing permits, not what it requires, so their results are the same;
- replay order, in-place ops, views and aliases: as recorded (``replay.py``);
- each replay draws fresh random numbers from the generators, which the capture leaves as it
  found them: seeding before capture makes the replays reproducible.
"""

from __future__ import annotations

import contextlib
import itertools

import torch
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from ..errors import UnsupportedCudaAPI, warn_once

# The recorder and the replay (``recording.py``, ``replay.py``) are imported at the first
# capture: the proxy ``torch.cuda`` binds ``CUDAGraph`` at every activation, and most programs
# never capture.

_pool_ids = itertools.count(1)
_CAPTURE_ERROR_MODES = ("global", "thread_local", "relaxed")


def graph_pool_handle():
    """An opaque token naming a memory pool graphs may share (as CUDA's, a pair of ints)."""
    return (0, next(_pool_ids))


# The recorders of the captures under way, in any thread: the float16 policy asks at every call
# whether its thread captures, which costs one read while this is empty.
_RECORDING = set()


def capturing_here() -> bool:
    """As ``is_capturing``, answered from one read where no thread captures."""
    return bool(_RECORDING) and recording_here() is not None


def recording_here():
    """The ``recording.Recorder`` of the capture the calling thread is in, or None."""
    if not _RECORDING:
        return None
    return next((mode for mode in _get_current_dispatch_mode_stack() if mode in _RECORDING), None)


def is_capturing() -> bool:
    """Whether the calling thread is capturing (autograd's engine threads too, while they run
    a captured backward)."""
    modes = _get_current_dispatch_mode_stack()
    if not modes:
        return False
    from .recording import Recorder
    return any(isinstance(mode, Recorder) for mode in modes)


class _GeneratorStates:
    """The states of the target's default generators, to give back after a capture."""

    def __init__(self, backend):
        count = max(1, backend.device_count())
        generators = {id(g): g for g in (backend.default_generator(i) for i in range(count))}
        self._states = [(g, g.get_state()) for g in generators.values()]

    def restore(self) -> None:
        for generator, state in self._states:
            generator.set_state(state)


def _error(message: str) -> RuntimeError:
    return getattr(torch, "AcceleratorError", RuntimeError)(message)


class RecordedGraph:
    """A CUDA graph made of the ops its capture recorded (``cudashim.graphs``)."""
    _backend = None                         # set on the class made for each activation

    def __init__(self, keep_graph: bool = False):
        self._keep_graph = keep_graph
        self._recorder = None                # a recording.Recorder while capturing
        self._steps = None                   # the recording, once captured
        self._replay = None                  # the replay, once instantiated
        self._pool = None
        self._debug = False

    # --- capture ------------------------------------------------------------------------
    def capture_begin(self, pool=None, capture_error_mode: str = "global", check_input_liveness: bool = False):
        if capture_error_mode not in _CAPTURE_ERROR_MODES:
            raise RuntimeError(f"Unknown capture error mode. Expected `global`, `thread_local`, or "
                               f"`relaxed`, got {capture_error_mode}")
        if self._recorder is not None or self._steps is not None:
            raise RuntimeError("This CUDAGraph instance already owns a captured graph. To capture "
                               "a new graph, create a new instance.")
        self._pool = tuple(pool) if pool is not None else (next(_pool_ids), 0)
        from .recording import Recorder

        self._generators = _GeneratorStates(self._backend)
        self._recorder = Recorder(self._backend.device_type)
        self._recorder.__enter__()
        _RECORDING.add(self._recorder)

    def capture_end(self) -> None:
        recorder, self._recorder = self._recorder, None
        if recorder is None:
            raise RuntimeError("Called CUDAGraph::capture_end without a preceding capture_begin.")
        recorder.__exit__(None, None, None)
        _RECORDING.discard(recorder)
        recorder.undo(self._generators)
        if recorder.error is not None:
            raise _error("CUDA error: operation failed due to a previous error during capture "
                         f"({recorder.error})")
        self._steps = recorder.steps
        if not self._keep_graph:
            self.instantiate()

    def instantiate(self) -> None:
        if self._steps is None:
            raise RuntimeError("Called CUDAGraph::instantiate without a preceding successful capture.")
        from .replay import replay_program

        self._replay = replay_program(self._steps)

    # --- use ----------------------------------------------------------------------------
    def replay(self) -> None:
        if self._replay is None:
            if self._steps is None:
                raise RuntimeError("Called CUDAGraph::replay without a preceding successful capture.")
            self.instantiate()
        self._replay()

    def reset(self) -> None:
        """Forget the recording and free the memory the capture made (a capture under way
        ends, leaving what it wrote as it found it)."""
        if self._recorder is not None:
            self._recorder.__exit__(None, None, None)
            _RECORDING.discard(self._recorder)
            self._recorder.undo(self._generators)
        self._recorder = self._steps = self._replay = None

    def pool(self):
        if self._pool is None:
            raise RuntimeError("Called CUDAGraph::pool without a preceding successful capture.")
        return self._pool

    # --- debugging ----------------------------------------------------------------------
    def enable_debug_mode(self) -> None:
        self._debug = True

    def debug_dump(self, debug_path: str) -> None:
        """Writes the recorded ops as a Graphviz graph: one node per op, an edge where an op
        reads memory another wrote."""
        if not self._debug:
            warn_once("graph-debug-dump", "CUDA Graphs debug not enabled, set with "
                                          "[graph].enable_debug_mode()")
            return
        if self._steps is None:
            raise RuntimeError("Called CUDAGraph::debug_dump without a preceding successful capture.")
        with open(debug_path, "w") as dot:
            dot.write(_dot(self._steps))

    def _refused(self, api: str):
        raise UnsupportedCudaAPI(f"torch.cuda.CUDAGraph.{api}", self._backend.name,
                                 "a recorded graph has no CUDA runtime handle; use replay()")

    def raw_cuda_graph(self) -> int:
        self._refused("raw_cuda_graph")

    def raw_cuda_graph_exec(self) -> int:
        self._refused("raw_cuda_graph_exec")

    def get_graph_data(self) -> dict:
        self._refused("get_graph_data")


def _dot(steps) -> str:
    from .recording import storage_key

    lines, last_writer = ["digraph CUDAGraph {"], {}
    for index, step in enumerate(steps):
        lines.append(f'  op{index} [label="{step.func}"];')
        read = {storage_key(a) for a in _tensors(step.args, step.kwargs)}
        for source in sorted({last_writer[key] for key in read if key in last_writer}):
            lines.append(f"  op{source} -> op{index};")
        for output in step.outputs:
            last_writer[storage_key(output)] = index
    return "\n".join(lines + ["}"]) + "\n"


def _tensors(args, kwargs):
    from torch.utils import _pytree as pytree
    return [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]


class CaptureContext:
    """``with torch.cuda.graph(g, pool=None, stream=None):`` captures the block into ``g``."""
    _backend = None
    default_capture_stream = None

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode: str = "global",
                 enable_annotations: bool = False, check_input_liveness: bool = False):
        self.cuda_graph = cuda_graph
        self.pool = () if pool is None else (pool,)
        self.capture_stream = stream
        self.capture_error_mode = capture_error_mode
        self.check_input_liveness = check_input_liveness
        self._stream = contextlib.nullcontext()

    def __enter__(self) -> None:
        self._backend.synchronize()
        if self.capture_stream is not None:
            self._stream = self._backend.stream(self.capture_stream)
        self._stream.__enter__()
        self.cuda_graph.capture_begin(*self.pool, capture_error_mode=self.capture_error_mode,
                                      check_input_liveness=self.check_input_liveness)

    def __exit__(self, exc_type, exc, traceback) -> None:
        try:
            if exc_type is None:
                self.cuda_graph.capture_end()
            else:                    # the block's error stands alone; the capture is dropped
                with contextlib.suppress(Exception):
                    self.cuda_graph.capture_end()
                self.cuda_graph.reset()
        finally:
            self._stream.__exit__(exc_type, exc, traceback)


def graphs_for(backend):
    """(CUDAGraph, graph) for ``backend``, named as torch.cuda names them."""
    graph_class = type("CUDAGraph", (RecordedGraph,), {"_backend": backend, "__module__": "torch.cuda",
                                                       "__doc__": RecordedGraph.__doc__})
    context = type("graph", (CaptureContext,), {"_backend": backend, "__module__": "torch.cuda",
                                                "__doc__": CaptureContext.__doc__})
    return graph_class, context
