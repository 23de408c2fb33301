"""Timing for answers that are kept: turns held up by other work on the CPU do not count."""

import os
import subprocess
import sys
import time

import pytest

from cudashim.backends import timing
from cudashim.backends.timing import CLEAN_TURNS_TO_KEEP, WARM_UP_TURNS, Stopwatch


class Scheduler:
    """What the system would say the process waited, turn by turn: a stalled turn's call returns
    at once (the fastest of all, were it counted) and waits 10 ms for a CPU; an unstalled one
    sleeps 5 ms and waits for nothing. The stopwatch reads the wait before and after each call."""

    def __init__(self, stalled_turns):
        self.stalled_turns = set(stalled_turns)
        self.turn, self.total, self.after = 0, 0, False

    def waited(self):
        if self.after:                                # the read after a call ends its turn
            self.total += 10_000_000 if self.turn in self.stalled_turns else 0
            self.turn += 1
        self.after = not self.after
        return self.total

    def call(self):
        if self.turn not in self.stalled_turns:
            time.sleep(0.005)


def timed(scheduler, turns=7):
    stopwatch = Stopwatch(scheduler.waited)
    return stopwatch, stopwatch.best_of_turns(scheduler.call, turns=turns)


def test_turns_whose_threads_waited_for_a_cpu_do_not_count():
    """The best time is the best of the unstalled turns: the stalled ones, though they took no
    time here, are not the call's speed."""
    stalled = {WARM_UP_TURNS, WARM_UP_TURNS + 2, WARM_UP_TURNS + 5}
    stopwatch, (best,) = timed(Scheduler(stalled))
    assert best >= 5.0
    assert not stopwatch.contended               # four of seven turns ran unstalled


def test_a_stall_of_a_moment_costs_a_turn_more_not_the_measurement():
    """A call short of clean turns takes more turns, as many as it still needs, while they
    run unstalled: the measurement is kept."""
    turns = 7
    for clean in range(CLEAN_TURNS_TO_KEEP):
        stalled = set(range(WARM_UP_TURNS + clean, WARM_UP_TURNS + turns))
        scheduler = Scheduler(stalled)
        stopwatch, (best,) = timed(scheduler, turns)
        assert best >= 5.0 and not stopwatch.contended
        assert scheduler.turn == WARM_UP_TURNS + turns + CLEAN_TURNS_TO_KEEP - clean


def test_a_call_held_up_throughout_makes_the_measurement_contended_after_one_turn_more():
    """Work that holds the CPU through the turns and the one after them: too few unstalled
    turns, and no more turns spent on finding that out."""
    turns = 7
    clean = CLEAN_TURNS_TO_KEEP - 1
    for_ever = range(WARM_UP_TURNS + clean, WARM_UP_TURNS + 3 * turns)
    scheduler = Scheduler(for_ever)
    stopwatch, (best,) = timed(scheduler, turns)
    assert best >= 5.0 and stopwatch.contended and stopwatch.contended_calls == 1
    assert scheduler.turn == WARM_UP_TURNS + turns + 1
    stopwatch, (best,) = timed(Scheduler(range(3 * turns)), turns)
    assert best < 5.0 and stopwatch.contended    # nothing unstalled: the best of what there is


def test_where_the_system_does_not_say_every_turn_counts():
    stopwatch = Stopwatch(lambda: None)
    best = stopwatch.best_of_turns(lambda: None, lambda: time.sleep(0.001))
    assert best[1] >= 1.0 > best[0] and not stopwatch.contended


def _schedstat_available():
    return timing.waited_ns() is not None and hasattr(os, "sched_setaffinity")


@pytest.mark.skipif(not _schedstat_available(), reason="the system does not count threads' wait for a CPU")
def test_a_call_timed_beside_a_busy_process_on_its_cpu_is_contended():
    """The real count: this process and a busy loop held to one CPU take turns on it, so every
    timed turn of a 20 ms computation waits for the loop's time slices, and the probe a program
    makes before it reads a provisional answer finds the CPU held."""
    cpu = min(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cpu})                     # this forked test process only
    busy = subprocess.Popen([sys.executable, "-c", f"import os\nos.sched_setaffinity(0, {{{cpu}}})\nwhile True: pass"])
    try:
        waited = timing.waited_ns()
        deadline = time.monotonic() + 30
        while timing.waited_ns() - waited < 50_000_000 and time.monotonic() < deadline:
            sum(range(100_000))                        # until the loop is seen taking the CPU
        counted = timing.waited_ns() - waited >= 50_000_000
        stopwatch = Stopwatch()
        stopwatch.best_of_turns(lambda: sum(range(500_000)))
        free = timing.cpu_is_free()
    finally:
        busy.kill()
        busy.wait()
    if not counted:                    # a kernel that shows the files but keeps them at zero
        pytest.skip("this kernel's schedstat did not count 30 s of sharing a CPU")
    assert stopwatch.contended and not free


class Turns:
    """A stopwatch whose turns answer the milliseconds a test gives, each call taking two turns."""
    contended = False

    def __init__(self, *milliseconds):
        self.milliseconds = list(milliseconds)

    def best_of_turns(self, *calls, turns):
        for _ in range(2):
            for call in calls:
                call()
        return self.milliseconds


@pytest.mark.parametrize("first_ms, second_ms, chosen", [
    (2.0, 1.0, 1),          # the second twice as fast
    (1.0, 2.0, 0),
    (1.0, 0.96, 0),         # within the margin: the first form stays
    (1.0, 0.94, 1),
])
def test_the_form_timed_faster_is_kept_for_its_kind_and_its_result_returned(first_ms, second_ms, chosen):
    """The faster form's index is kept under the kind's key and told once; the result returned is
    the chosen form's, from its last call; the first form stays unless the second wins by more
    than the margin."""
    forms = timing.FasterAtFirstCall(margin=0.05)
    forms.stopwatch = lambda: Turns(first_ms, second_ms)
    calls, told = [0, 0], []

    def form(index):
        def call():
            calls[index] += 1
            return (index, calls[index])
        return call
    result = forms.timed("kind", form(0), form(1), told.append)
    assert calls == [3, 3]                       # one call each to set up, two turns each
    assert result == (chosen, 3) and told == [chosen]
    assert forms.chosen == {"kind": chosen} and forms.timings == {"kind": (first_ms, second_ms)}
    forms.clear()
    assert not forms.chosen and not forms.timings


@pytest.mark.parametrize("unable", [0, 1])
def test_a_form_that_cannot_compute_the_call_leaves_it_to_the_other_and_nothing_is_kept(unable):
    """A form answering NotImplemented (a weight the budget cannot keep packed) is not timed: the
    other's result is returned, and the next call of the kind is timed again."""
    forms = timing.FasterAtFirstCall()
    forms.stopwatch = lambda: pytest.fail("nothing is timed")
    told = []
    answers = ["first", "second"]
    answers[unable] = NotImplemented
    assert forms.timed("kind", lambda: answers[0], lambda: answers[1], told.append) == answers[1 - unable]
    assert not forms.chosen and not told
    assert forms.timed("kind", lambda: NotImplemented, lambda: NotImplemented) is NotImplemented
