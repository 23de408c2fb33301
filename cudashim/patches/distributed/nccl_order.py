"""NCCL completes a group's collectives in the order they were issued; gloo does not.

NCCL runs every collective of a communicator on one CUDA stream, so once any of them is
complete, every one issued before it is complete too. Code written for NCCL relies on that:
DeepSpeed's ZeRO-3 launches one asynchronous all-gather per parameter, waits on the last
handle only ("wait ensures the operation is enqueued") and then reads every gathered
buffer. Gloo hands a group's work to a pool of threads, so an earlier, larger collective
may still be writing when a later one has finished: the program then reads memory the
collective has not filled yet (a NaN loss now and then, more often on a loaded machine).

For the groups made from an NCCL request on a library that completes out of order, each
collective's work is handed back wrapped so that waiting on it, asking whether it is
complete, or taking its future also covers every collective issued on the group before it,
and a blocking collective returns once the ones before it have finished: NCCL's order,
kept where the program observes it. Nothing runs later than it would have; only waits
that NCCL would also have made wait.
"""

from __future__ import annotations

import collections
import functools
import inspect
import threading
import weakref

import torch

from ...backends import staged

# The libraries that hand a group's collectives to several threads, so that a later one can
# finish first: gloo, and cudashim's host-staged library, gloo underneath for host tensors.
# NCCL, HCCL, XCCL and oneCCL order a communicator's work on a stream, and MPI runs it on
# one thread.
COMPLETES_OUT_OF_ORDER = frozenset({"gloo", staged.NAME})


class IssueOrder:
    """The asynchronous collectives of each ordered group that may still be running, oldest
    first."""

    def __init__(self, c10d, is_ordered):
        self.c10d = c10d
        self._is_ordered = is_ordered             # group -> bool: made from NCCL, on gloo
        self._pending = weakref.WeakKeyDictionary()  # group -> deque of torch's works
        self._lock = threading.Lock()
        self.calling = _Calling()                 # inside a wrapped collective, per thread

    def group_of(self, group):
        """The process group a collective's ``group`` argument means, if it is ordered here."""
        if group is None:
            if not self.c10d.is_initialized():
                return None
            group = self.c10d._get_default_group()
        if not isinstance(group, self.c10d.ProcessGroup) or not self._is_ordered(group):
            return None
        return group

    def issued(self, group, work):
        """``work`` was just issued on ``group``: the handle the program gets instead."""
        with self._lock:
            queue = self._pending.setdefault(group, collections.deque())
            _drop_finished(queue)
            earlier = tuple(queue)
            queue.append(work)
        return _in_issue_order_class()(work, earlier, queue) if earlier else work

    def finished_before(self, group, timeout=None) -> None:
        """A blocking collective has returned: the ones issued before it finish first."""
        queue = self._pending.get(group)
        if queue:
            for work in tuple(queue):
                _wait(work, timeout)
            _drop_finished(queue)


@functools.lru_cache(maxsize=None)
def _in_issue_order_class():
    """Made on first use: torch builds without ``torch.distributed`` have no ``Work``."""

    class InIssueOrder(torch.distributed.Work):
        """A collective's work that completes, for the program, only after every collective
        issued on its group before it (the NCCL order). Everything else is the real work's."""

        def __init__(self, work, earlier, queue):
            super().__init__()
            self._work, self._earlier, self._queue = work, earlier, queue

        def wait(self, timeout=None):
            for work in self._earlier:
                _wait(work, timeout)
            done = _wait(self._work, timeout)
            self._earlier = ()
            _drop_finished(self._queue)
            return done

        def is_completed(self):
            return all(work.is_completed() for work in (*self._earlier, self._work))

        def get_future(self):
            mine = self._work.get_future()
            if not self._earlier:
                return mine
            everything = torch.futures.collect_all([*(w.get_future() for w in self._earlier), mine])
            return everything.then(lambda _: mine.value())

        def synchronize(self):
            self.wait()

        def __getattr__(self, name):               # result, exception, source_rank, boxed, ...
            return getattr(self._work, name)

        def __repr__(self):
            return f"<{type(self).__name__} of {self._work!r} after {len(self._earlier)} earlier>"

    return InIssueOrder


class _Calling(threading.local):
    active = False


def _wait(work, timeout):
    return work.wait() if timeout is None else work.wait(timeout)


def _drop_finished(queue) -> None:
    while queue and queue[0].is_completed():
        queue.popleft()


def in_issue_order(order: IssueOrder):
    """A wrapper for one collective function of ``torch.distributed``."""
    def make(original):
        signature = inspect.signature(original)

        @functools.wraps(original)
        def collective(*args, **kwargs):
            if order.calling.active:                 # an old name calling its new one
                return original(*args, **kwargs)
            order.calling.active = True
            try:
                result = original(*args, **kwargs)
            finally:
                order.calling.active = False
            bound = signature.bind(*args, **kwargs)
            group = order.group_of(bound.arguments.get("group"))
            if group is None:
                return result
            if not bound.arguments.get("async_op", False):
                order.finished_before(group)
            elif _is_library_work(order.c10d, result):
                return order.issued(group, result)
            return result
        return collective
    return make


def _is_library_work(c10d, result) -> bool:
    """A work the library handed back; not None (a rank outside the group) nor torch's
    placeholder inside a coalescing block."""
    return isinstance(result, torch.distributed.Work) and \
        not isinstance(result, getattr(c10d, "_IllegalWork", ()))


def collectives(c10d) -> list:
    """The names of the collective functions in ``c10d``: those that take ``async_op``,
    point-to-point ones aside (NCCL pairs their sends and receives on streams of their own)."""
    names = []
    for name in getattr(c10d, "__all__", ()):
        function = getattr(c10d, name, None)
        if not callable(function) or isinstance(function, type) or name in _POINT_TO_POINT:
            continue
        try:
            parameters = inspect.signature(function).parameters
        except (TypeError, ValueError):
            continue
        if "async_op" in parameters and "group" in parameters:
            names.append(name)
    return names


_POINT_TO_POINT = frozenset({"send", "recv", "isend", "irecv", "batch_isend_irecv",
                             "send_object_list", "recv_object_list"})
