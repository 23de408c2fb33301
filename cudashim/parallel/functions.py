"""The autograd functions of ``torch.nn.parallel`` over ``DeviceComm``.

``replicate``, ``scatter`` and ``gather`` build their graphs from four functions in
``torch.nn.parallel._functions``; these are the same functions with the same gradients
(a broadcast's is the sum of the copies' gradients on its source device, a scatter's is the
gather of its chunks' gradients, and back), moving tensors with ``DeviceComm`` instead of
NCCL and taking inputs in host memory where the target is the host. Gradients of every
replica are thus reduced onto the first device, as on CUDA.
"""

from __future__ import annotations

import warnings
from itertools import chain

import torch
from torch.autograd import Function

from .comm import HOST, DeviceComm


def autograd_functions(comm: DeviceComm) -> dict:
    """{name in torch.nn.parallel._functions: the function moving tensors with ``comm``}."""
    on_device = comm.backend.device_type

    def check_on_device(what, tensors):
        if on_device != "cpu" and not all(t.device.type != "cpu" for t in tensors):
            raise AssertionError(f"{what} function not implemented for CPU tensors")

    class Broadcast(Function):
        @staticmethod
        def forward(ctx, target_gpus, *inputs):
            check_on_device("Broadcast", inputs)
            ctx.target_gpus = [comm.index(x, optional=True) for x in target_gpus]
            if len(inputs) == 0:
                return ()
            ctx.num_inputs = len(inputs)
            ctx.input_device = comm.index_of(inputs[0])
            complex_mask = [t.is_complex() for t in inputs]
            outputs = comm.broadcast_coalesced(inputs, ctx.target_gpus)
            for device_outputs in outputs:
                for i, is_complex in enumerate(complex_mask):
                    if is_complex:
                        device_outputs[i] = torch.view_as_complex(device_outputs[i])
            ctx.mark_non_differentiable(*(output[i] for i, needs in enumerate(ctx.needs_input_grad[1:])
                                          if not needs for output in outputs))
            return tuple(chain.from_iterable(outputs))

        @staticmethod
        def backward(ctx, *grad_outputs):
            return (None,) + ReduceAddCoalesced.apply(ctx.input_device, ctx.num_inputs, *grad_outputs)

    class ReduceAddCoalesced(Function):
        @staticmethod
        def forward(ctx, destination, num_inputs, *grads):
            ctx.target_gpus = [comm.index_of(grads[i]) for i in range(0, len(grads), num_inputs)]
            complex_mask = [grads[i].is_complex() for i in range(num_inputs)]
            real = [torch.view_as_real(g) if g.is_complex() else g for g in grads]
            per_device = [real[i:i + num_inputs] for i in range(0, len(real), num_inputs)]
            results = comm.reduce_add_coalesced(per_device, destination)
            return tuple(torch.view_as_complex(r) if is_complex else r
                         for r, is_complex in zip(results, complex_mask))

        @staticmethod
        def backward(ctx, *grad_outputs):
            return (None, None) + Broadcast.apply(ctx.target_gpus, *grad_outputs)

    class Gather(Function):
        @staticmethod
        def forward(ctx, target_device, dim, *inputs):
            check_on_device("Gather", inputs)
            ctx.target_device = ("cpu" if target_device == "cpu"
                                 else comm.index(target_device, optional=True, allow_cpu=True))
            ctx.dim = dim
            ctx.input_gpus = tuple(comm.index_of(t) for t in inputs)
            ctx.unsqueezed_scalar = all(t.dim() == 0 for t in inputs) and dim == 0
            if ctx.unsqueezed_scalar:
                inputs = tuple(t.view(1) for t in inputs)
                warnings.warn("Was asked to gather along dimension 0, but all input tensors were "
                              "scalars; will instead unsqueeze and return a vector.", stacklevel=2)
            ctx.input_sizes = tuple(t.size(ctx.dim) for t in inputs)
            output = comm.gather(inputs, ctx.dim, ctx.target_device)
            return torch.view_as_complex(output) if inputs and inputs[0].is_complex() else output

        @staticmethod
        def backward(ctx, grad_output):
            grads = Scatter.apply(ctx.input_gpus, ctx.input_sizes, ctx.dim, grad_output)
            if ctx.unsqueezed_scalar:
                grads = tuple(g[0] for g in grads)
            return (None, None) + grads

    class Scatter(Function):
        @staticmethod
        def forward(ctx, target_gpus, chunk_sizes, dim, input):
            target_gpus = [comm.index(x, optional=True) for x in target_gpus]
            ctx.dim = dim
            ctx.input_device = comm.index_of(input)     # HOST: the gradient goes back to the host
            outputs = comm.scatter(input, target_gpus, chunk_sizes, ctx.dim)
            if input.is_complex():
                outputs = tuple(torch.view_as_complex(o) for o in outputs)
            return outputs

        @staticmethod
        def backward(ctx, *grad_output):
            destination = "cpu" if ctx.input_device == HOST else ctx.input_device
            return None, None, None, Gather.apply(destination, ctx.dim, *grad_output)

    functions = {"Broadcast": Broadcast, "ReduceAddCoalesced": ReduceAddCoalesced,
                 "Gather": Gather, "Scatter": Scatter}
    for name, function in functions.items():
        function.__module__, function.__qualname__ = "torch.nn.parallel._functions", name
    return functions
