"""Timing calls on a CPU that other work may share, for answers that are kept.

The precision policy times a few calls once per CPU and keeps what it chose for good
(``cpu_speed``). A turn timed while one of the process's threads waited for a CPU measures the
other work, not the call: on a 2-core AMD EPYC with two busy loops beside it, a 2-row bfloat16
product took 7.8 ms instead of 0.07, and its threads waited 8.0 ms of it; a table timed during a
test suite chose float32 where bfloat16 was three times faster, and float16 generation ran at
half its speed from then on. Taking the best of several turns does not help when every turn is
held up.

Linux counts, for each thread, the time it was runnable but not running (the second field of
``/proc/self/task/TID/schedstat``). A turn whose threads waited for more than
``STALLED_ABOVE`` of its time is stalled and does not count. A call that ran fewer than
``CLEAN_TURNS_TO_KEEP`` turns unstalled takes more, for as long as they run unstalled: a stall
of a moment costs a turn. (On an idle 2-core EPYC virtual machine, ten timings of the float16
op table out of ten had a turn that waited for a CPU, once 3.5 ms of a 25 ms turn: each was
kept as provisional, and every program after them timed the table again.) A measurement in
which a call still has too few is contended: it serves the process that took it, and is kept
as provisional (``cpu_speed``): later processes read it until one starts on a CPU it gets to
itself (``cpu_is_free``) and times it again. Where the system does not say (another OS, a
kernel without scheduler statistics), every turn counts, as before.
"""

from __future__ import annotations

import os
import time
from typing import Callable, List, Optional

_TASKS = "/proc/self/task"
# A turn is stalled when its threads waited for a CPU longer than this share of it. Unloaded,
# a 10 ms product's threads waited 0 to 54 us a turn (a timer tick, a kernel thread).
STALLED_ABOVE = 0.05
# Of the turns each call is timed in, at least this many must run unstalled for the measurement
# to be kept.
CLEAN_TURNS_TO_KEEP = 3
WARM_UP_TURNS = 2
# How long ``cpu_is_free`` asks for a CPU: longer than the scheduler's time slice (3 to 24 ms on
# Linux), so that a process beside busy ones is seen waiting whatever its place in the queue.
FREE_PROBE_SECONDS = 0.03
# Named in the keys of the answers kept: one timed before stalled turns were told apart is timed
# again.
UNSTALLED = "stalled turns not counted"


def waited_ns() -> Optional[int]:
    """The nanoseconds this process's threads have spent runnable and waiting for a CPU, or None
    where the system does not say."""
    try:
        tasks = os.listdir(_TASKS)
    except OSError:
        return None
    total, found = 0, False
    for task in tasks:
        try:
            with open(f"{_TASKS}/{task}/schedstat", "rb") as stat:
                total += int(stat.read().split()[1])
                found = True
        except (OSError, ValueError, IndexError):       # a thread that ended since the listing
            continue
    return total if found else None


def cpu_is_free(seconds: float = FREE_PROBE_SECONDS) -> bool:
    """Whether this process gets a CPU of its own now: a busy loop of ``seconds`` whose threads
    waited for one no longer than ``STALLED_ABOVE`` of its time. True where the system does not
    say (every turn counts there, so no answer is provisional)."""
    before = waited_ns()
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        pass
    elapsed = time.perf_counter() - start
    after = waited_ns()
    if before is None or after is None:
        return True
    return after - before <= STALLED_ABOVE * elapsed * 1e9


class Stopwatch:
    """Times calls in turns and counts the calls that could not be timed on a CPU of their own.

    ``waited`` reads the process's wait for a CPU in nanoseconds (``waited_ns``); a test gives
    its own."""

    def __init__(self, waited: Optional[Callable[[], Optional[int]]] = None):
        self._waited = waited or waited_ns
        self.contended_calls = 0

    @property
    def contended(self) -> bool:
        """Whether a call timed so far ran too few turns unstalled: the answer is not to be kept."""
        return self.contended_calls > 0

    def best_of_turns(self, *calls: Callable[[], object], turns: int = 7) -> List[float]:
        """The best milliseconds of each call over ``turns`` turns unstalled (over all of them
        where none was), the calls taking turns after ``WARM_UP_TURNS`` untimed ones.

        Where a call ran fewer than ``CLEAN_TURNS_TO_KEEP`` of them unstalled, the calls take
        more turns, up to ``turns`` more, for as long as each turn more gives the calls short of
        clean turns one more: a stall of a moment (another process's time slice, a kernel
        thread, a neighbour on a virtual machine's host) costs a turn, not the measurement,
        and work that holds the CPU throughout costs one turn more before the measurement is
        found contended."""
        needed = min(CLEAN_TURNS_TO_KEEP, turns)
        clean_best = [float("inf")] * len(calls)
        any_best = [float("inf")] * len(calls)
        clean_turns = [0] * len(calls)

        def turn(timed: bool) -> bool:
            """Each call once; whether every call that was short of clean turns ran unstalled."""
            all_clean = True
            for index, call in enumerate(calls):
                short = clean_turns[index] < needed
                waited_before = self._waited()
                start = time.perf_counter()
                call()
                elapsed = time.perf_counter() - start
                waited_after = self._waited()
                if not timed:
                    continue
                any_best[index] = min(any_best[index], elapsed)
                unknown = waited_before is None or waited_after is None
                if unknown or waited_after - waited_before <= STALLED_ABOVE * elapsed * 1e9:
                    clean_turns[index] += 1
                    clean_best[index] = min(clean_best[index], elapsed)
                elif short:
                    all_clean = False
            return all_clean

        for _ in range(WARM_UP_TURNS):
            turn(timed=False)
        for _ in range(turns):
            turn(timed=True)
        for _ in range(turns):
            if all(count >= needed for count in clean_turns) or not turn(timed=True):
                break
        self.contended_calls += sum(1 for count in clean_turns if count < needed)
        return [(clean if count else fallback) * 1e3
                for clean, fallback, count in zip(clean_best, any_best, clean_turns)]


class FasterAtFirstCall:
    """Which of two ways of computing a kind of call runs faster on this CPU, timed at the first
    call of each kind and kept for the process, as cuDNN's benchmark mode times its algorithms at
    the first call of each shape.

    A kind is whatever key the caller gives (a layer's sizes and a class of input sizes). The
    first form is the one kept where the second is not faster by more than ``margin``: the
    measurement decides only what it tells apart. A measurement on a CPU other work holds
    throughout still decides, so that a program started beside busy ones does not time every
    call (``Stopwatch`` gives the best of the turns it had)."""

    def __init__(self, turns: int = 3, margin: float = 0.05):
        self.turns = turns
        self.margin = margin
        self.stopwatch = Stopwatch          # a test gives one whose turns answer what it says
        self.chosen = {}                    # key -> 0 or 1, the form each kind of call takes
        self.timings = {}                   # key -> (first ms, second ms), as measured

    def timed(self, key, first: Callable[[], object], second: Callable[[], object],
              chosen: Callable[[int], None] = lambda index: None):
        """The call computed by ``first`` and by ``second`` (each answering NotImplemented where
        it cannot compute it), both timed, the faster one's index kept under ``key`` and told to
        ``chosen``, and its result returned. Where either cannot compute the call, nothing is
        kept: the result is the other's (NotImplemented where neither could)."""
        results = [first(), second()]                 # each form's first call sets it up
        if NotImplemented in results:
            return results[0] if results[1] is NotImplemented else results[1]

        def keeping(index, form):
            def call():
                results[index] = form()
            return call
        times = self.stopwatch().best_of_turns(keeping(0, first), keeping(1, second), turns=self.turns)
        index = 1 if times[1] < times[0] * (1 - self.margin) else 0
        self.timings[key] = tuple(times)
        self.chosen[key] = index
        chosen(index)
        return results[index]

    def clear(self):
        self.chosen.clear()
        self.timings.clear()
