"""A batch of point-to-point operations is one work, as NCCL makes it.

``batch_isend_irecv`` on NCCL coalesces the batch: the list it returns holds one work, which
completes when every send and receive of the batch has. Code written for NCCL relies on that:
torch 2.7's own pipeline schedules wait on ``batch_isend_irecv(ops).pop()`` alone.
Gloo returns one work per operation; the others are dropped unwaited, a receive may not have
landed when the stage reads its buffer, and a schedule of two ranks that each send and receive
in one batch waits forever (on gloo itself too, without cudashim).

For the groups made from an NCCL request, a batch the library did not coalesce is handed back
as NCCL hands it: a list of one work that waits for all of them, raising the first failure.
"""

from __future__ import annotations

import functools

import torch


def coalescing(made_for_nccl):
    """The wrapper of ``batch_isend_irecv`` for the groups ``made_for_nccl`` says."""
    def make(original):
        @functools.wraps(original)
        def batch_isend_irecv(p2p_op_list):
            works = original(p2p_op_list)
            if not isinstance(works, list) or len(works) < 2 or not made_for_nccl(p2p_op_list[0].group):
                return works
            return [_batch_class()(works)]
        return batch_isend_irecv
    return make


@functools.lru_cache(maxsize=None)
def _batch_class():
    """Made on first use: torch builds without ``torch.distributed`` have no ``Work``."""

    class Batch(torch.distributed.Work):
        """The works of one batch, as one."""

        def __init__(self, works):
            super().__init__()
            self._works = list(works)

        def wait(self, timeout=None):
            for work in self._works:
                work.wait() if timeout is None else work.wait(timeout)
            return True

        def is_completed(self):
            return all(work.is_completed() for work in self._works)

        def is_success(self):
            return all(work.is_success() for work in self._works)

        def exception(self):
            return next((error for error in (work.exception() for work in self._works) if error), None)

        def get_future(self):
            return torch.futures.collect_all([work.get_future() for work in self._works]).then(
                lambda done: [tensor for future in done.value() for tensor in future.value()])

        def result(self):
            return [tensor for work in self._works for tensor in work.result()]

        def synchronize(self):
            self.wait()

        def __repr__(self):
            return f"<{type(self).__name__} of {len(self._works)} point-to-point works>"

    return Batch
