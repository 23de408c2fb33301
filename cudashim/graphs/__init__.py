"""CUDA graphs on targets without graphs of their own: capture records, replay recomputes.

While a graph captures, a dispatch mode records every op that reaches the target's kernels
(the forward, the backward autograd's engine runs, the optimizer's updates), with the tensors
it read and wrote (``recording.py``). Nothing the capture made is freed while the graph lives,
as CUDA keeps a graph's memory pool, so every tensor the program holds from the capture (static
outputs, intermediates, ``.grad``) keeps its memory. ``replay()`` reruns the recorded ops into
that same memory (``replay.py``): what the program copied into the static inputs is read, and
the static outputs hold what a CUDA replay would leave there.

CUDA does not run the work it captures; here the capture runs it to learn what it makes. So
that capturing changes nothing CUDA would leave alone, the tensors from before the capture
that it wrote (parameters an optimizer step updated, running statistics) get their values back
when the capture ends, and the generators their states: the first replay then computes what
the first eager step would. ``graph.py`` is the ``torch.cuda`` surface on top (``CUDAGraph``,
``torch.cuda.graph``, pools); ``callables.py`` is ``make_graphed_callables``.
"""
