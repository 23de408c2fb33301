"""One process, several devices: ``torch.nn.parallel``'s primitives on the target's devices.

``nn.DataParallel``, ``nn.parallel.data_parallel``, ``replicate``/``scatter``/``gather``/
``parallel_apply`` and ``torch.cuda.comm`` speak CUDA indices. Here they move tensors between
the devices those indices stand for (``comm.py``), carry gradients back across the moves
(``functions.py``) and run replicas on threads, each with its own current device, stream and
autocast state (``apply.py``). Where several CUDA indices share one real device (the CPU's
virtual devices, ``--device-count`` above an accelerator's count), a move between two of them
is a copy on that device, so replicas never share memory that separate GPUs would not.
"""
