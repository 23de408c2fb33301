"""``torch.cuda``'s graph names: the target's own graphs where it has them, else recorded ones.

A target with a graph API of its own (``torch.xpu.XPUGraph``, torch_npu's ``NPUGraph``, found by
the backend) captures and replays with it. Elsewhere graphs record the ops their capture runs
and rerun them on replay (``cudashim.graphs``).
"""

from __future__ import annotations

import functools
import types

from ..graphs import graph
from .implementation_base import Implementation


class CudaGraphs(Implementation):
    """The CUDA-graph names of ``torch.cuda`` (and ``torch.cuda.graphs``)."""

    @functools.cached_property
    def _graphs(self) -> types.SimpleNamespace:
        native = self.backend.native_graphs()
        if native is not None:
            return types.SimpleNamespace(
                CUDAGraph=getattr(native, self.backend.graph_class), graph=native.graph,
                graph_pool_handle=native.graph_pool_handle, make_graphed_callables=native.make_graphed_callables,
                is_current_stream_capturing=native.is_current_stream_capturing)
        graph_class, context = graph.graphs_for(self.backend)
        return types.SimpleNamespace(
            CUDAGraph=graph_class, graph=context, graph_pool_handle=graph.graph_pool_handle,
            make_graphed_callables=functools.partial(_graphed_on_recordings, graph_class, context),
            is_current_stream_capturing=graph.is_capturing)

    @functools.cached_property
    def CUDAGraph(self):
        return self._graphs.CUDAGraph

    @functools.cached_property
    def graph(self):
        return self._graphs.graph

    def graph_pool_handle(self):
        return self._graphs.graph_pool_handle()

    def is_current_stream_capturing(self) -> bool:
        return self._graphs.is_current_stream_capturing()

    def make_graphed_callables(self, callables, sample_args, num_warmup_iters=3,
                               allow_unused_input=False, pool=None):
        return self._graphs.make_graphed_callables(callables, sample_args, num_warmup_iters=num_warmup_iters,
                                                   allow_unused_input=allow_unused_input, pool=pool)


def _graphed_on_recordings(graph_class, context, *args, **kwargs):
    """``make_graphed_callables`` on recorded graphs (imported at the first call: few programs
    make graphed callables)."""
    from ..graphs import callables

    return callables.make_graphed_callables(graph_class, context, graph.graph_pool_handle, *args, **kwargs)
