"""``torch.cuda.make_graphed_callables`` on recorded graphs, with torch's documented contract.

Each callable's forward and backward are captured as two graphs after warm-up iterations, and
the callable returned runs them inside one autograd node: its forward replays the forward
graph into static outputs, its backward copies the incoming gradients into static gradient
outputs and replays the backward graph. Forwards are captured in order and backwards in
reverse, all in one pool, as they will run. A module's forward is replaced only while its
training mode is the one it was graphed in.
"""

from __future__ import annotations

from typing import Callable, Sequence, Tuple

import torch
from torch.utils import _pytree as pytree


def make_graphed_callables(graph_class, capture, graph_pool_handle, callables, sample_args,
                           num_warmup_iters: int = 3, allow_unused_input: bool = False, pool=None):
    """``capture`` is the ``torch.cuda.graph`` context for ``graph_class``'s graphs."""
    if torch.is_autocast_enabled() and torch.is_autocast_cache_enabled():
        raise RuntimeError("make_graphed_callables does not support the autocast caching. "
                           "Please set `cache_enabled=False`.")
    just_one = not isinstance(callables, tuple)
    if just_one:
        callables, sample_args = (callables,), (sample_args,)
    flat_args = [tuple(pytree.arg_tree_leaves(*args)) for args in sample_args]
    for function, args in zip(callables, flat_args):
        _check_callable(function, args)
    params = [tuple(f.parameters()) if isinstance(f, torch.nn.Module) else () for f in callables]
    surfaces = [args + own for args, own in zip(flat_args, params)]
    mempool = graph_pool_handle() if pool is None else pool

    for function, args, surface in zip(callables, sample_args, surfaces):
        for _ in range(num_warmup_iters):
            outputs = [o for o in pytree.tree_leaves(function(*args)) if o.requires_grad]
            if outputs:
                torch.autograd.grad(outputs, [i for i in surface if i.requires_grad],
                                    grad_outputs=[torch.empty_like(o) for o in outputs],
                                    only_inputs=True, allow_unused=allow_unused_input)

    forwards, static_outputs, specs = [], [], []
    for function, args in zip(callables, sample_args):
        graph = graph_class()
        with capture(graph, pool=mempool):
            outputs = function(*args)
        flat, spec = pytree.tree_flatten(outputs)
        forwards.append(graph)
        static_outputs.append(tuple(flat))
        specs.append(spec)

    backwards, grad_outputs, grad_inputs = [], [], []
    for surface, outputs in reversed(list(zip(surfaces, static_outputs))):
        graph = graph_class()
        wanted = tuple(torch.empty_like(o) if o.requires_grad else None for o in outputs)
        needing = [i for i in surface if i.requires_grad]
        grads = None
        if any(o.requires_grad for o in outputs):
            with capture(graph, pool=mempool):
                grads = torch.autograd.grad([o for o in outputs if o.requires_grad], needing,
                                            grad_outputs=[g for g in wanted if g is not None],
                                            only_inputs=True, allow_unused=allow_unused_input)
        by_input = iter(grads or ())
        backwards.append(graph)
        grad_outputs.append(wanted)
        grad_inputs.append(tuple(next(by_input) if i.requires_grad and grads is not None else None
                                 for i in surface))
    backwards.reverse()
    grad_outputs.reverse()
    grad_inputs.reverse()

    graphed = []
    for index, function in enumerate(callables):
        run = _graphed_function(forwards[index], backwards[index], params[index], len(flat_args[index]),
                                specs[index], surfaces[index], static_outputs[index],
                                grad_outputs[index], grad_inputs[index])
        if isinstance(function, torch.nn.Module):
            function.forward = _forward_while_mode_matches(function, run, function.forward)
            graphed.append(function)
        else:
            graphed.append(run)
    return graphed[0] if just_one else tuple(graphed)


def _check_callable(function, flat_args) -> None:
    if isinstance(function, torch.nn.Module):
        if function._backward_hooks or function._forward_hooks or function._forward_pre_hooks:
            raise AssertionError("Modules must not have hooks registered at the time they are passed. "
                                 "However, registering hooks on modules after passing them through "
                                 "make_graphed_callables is allowed.")
        if any(buffer.requires_grad for buffer in function.buffers()):
            raise AssertionError("In any :class:`~torch.nn.Module` passed to :func:`~make_graphed_callables`, "
                                 "only parameters may be trainable. All buffers must have "
                                 "``requires_grad=False``.")
    if not all(isinstance(arg, torch.Tensor) for arg in flat_args):
        raise AssertionError("In the beta API, sample_args for each callable must contain only Tensors. "
                             "Other types are not allowed.")


def _graphed_function(forward_graph, backward_graph, module_params: Tuple, user_args: int, spec,
                      surface: Sequence[torch.Tensor], static_outputs, static_grad_outputs,
                      static_grad_inputs) -> Callable:
    class Graphed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *inputs):
            for static, given in zip(surface[:user_args], inputs[:user_args]):
                if static.data_ptr() != given.data_ptr():
                    static.copy_(given)
            forward_graph.replay()
            return tuple(o.detach() for o in static_outputs)

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, *grads):
            for static, grad in zip(static_grad_outputs, grads):
                if static is not None and grad is not None and static.data_ptr() != grad.data_ptr():
                    static.copy_(grad)
            backward_graph.replay()
            return tuple(g.detach() if g is not None else None for g in static_grad_inputs)

    def graphed(*args):
        flat = tuple(pytree.arg_tree_leaves(*args))
        return pytree.tree_unflatten(list(Graphed.apply(*(flat + module_params))), spec)
    return graphed


def _forward_while_mode_matches(module, graphed, original_forward):
    training = module.training

    def forward(*args, **kwargs):
        return graphed(*args, **kwargs) if module.training == training else original_forward(*args, **kwargs)
    return forward
