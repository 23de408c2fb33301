"""Paired, interleaved timing and the verdicts drawn from it, shared by the benchmarks.

Two sides of a row take turns call by call in one process, so that both see the same drift of
a shared machine; the speed is the median of the per-turn ratios, and its spread the middle
half of them. A target inside that spread is not resolved by this host: the row says so
rather than pass or fail on noise.
"""

import statistics
import time

WARM_UP_TURNS = 3


def timed(functions, repeats, warm_up=WARM_UP_TURNS):
    """Time each of ``functions`` (name -> callable) ``repeats`` times, taking turns call by
    call, after ``warm_up`` untimed turns (a process's first writes into fresh large buffers
    are slow on some VMs, either side's). Returns {name: [milliseconds per turn]}."""
    for _ in range(warm_up):
        for function in functions.values():
            function()
    samples = {name: [] for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            samples[name].append((time.perf_counter() - start) * 1e3)
    return samples


def summary(samples):
    """Median, min and max of one side's samples (milliseconds)."""
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples)}


def quartiles(values):
    ordered = sorted(values)
    if len(ordered) < 4:
        return ordered[0], ordered[-1]
    q = statistics.quantiles(ordered, n=4)
    return q[0], q[2]


def speed(reference, mine):
    """How many times faster ``mine`` is than ``reference``, turn by turn: the median of the
    per-turn ratios and their middle half."""
    ratios = [r / m for r, m in zip(reference, mine)]
    low, high = quartiles(ratios)
    return {"median": statistics.median(ratios), "low": low, "high": high}


def verdict(ratio, target):
    """'yes', 'no', or 'unresolved' where the target lies inside the ratio's spread."""
    if target is None:
        return "-"
    if ratio["low"] <= target <= ratio["high"]:
        return "unresolved (target within the spread)"
    return "yes" if ratio["median"] >= target else "no"
