"""Which reduced-precision dtypes this CPU computes fast.

On x86 the instruction set decides, and torch reports it: bfloat16 matmuls are fast with
AVX512_BF16 or AMX, float16 ones with AMX-FP16 only; without them oneDNN and torch's own kernels
convert element by element, tens of times slower than float32. "Fast" means nothing is faster
to ask for: the policy then computes every float16 call as asked and measures nothing. AVX512-FP16
alone is not that. A Xeon with AVX512-FP16 and AMX-BF16 (no AMX-FP16) computed float16 products
at float32's speed (1024 x 1024 weights, 256 rows: 4.46 ms against 4.53, and 1.44 in bfloat16),
its convolutions at 1.6 times float32's time and 5 times bfloat16's, and float16 powers and
group norms at 14 and 4 times float32's. Such a CPU is answered "float16 slow", and the
measurements below choose each call's dtype, as on a CPU that emulates float16. Elsewhere
(Arm, with or without its BF16 and FP16 extensions, which torch does not report) a short
calibration decides: one small matmul per dtype against float32 and against each other. It runs once per machine
and torch version, when a policy first asks (never at import), and is cached where the user's
caches live (``$CUDASHIM_CACHE_DIR``, else ``$XDG_CACHE_HOME/cudashim``, else
``~/.cache/cudashim``). An answer timed while other work held the CPU (``timing``) is kept as
provisional: the processes after it read it while the CPU is still shared, and the first that
starts on a free CPU times it again and keeps that answer for good.

Where float16 is slow, what explicit float16 matmuls compute in is measured too
(``matmul_choices``): each shape class timed in float16 as asked, in bfloat16 and in float32
(weights converted once, as the policy keeps them), once per CPU, thread count and torch
version, cached beside the speeds. The memory-bound class (decoding) is timed as a decoder
reads its weights: each product on a weight of its own, from a set of decoder blocks larger than
the last-level cache, as a model's layers are read once a token (``_streamed_call``); its choice
weighs a second kept copy of each weight against a choice other than the compute-bound
class's (``_SECOND_COPY``). Attention (``scaled_dot_product_attention``) is timed on
its own shapes, as a decoding step and as a prefill, its operands converted on every call: it
has no weights to keep, and torch's CPU kernels for it are not its products' (in float16 and
bfloat16 they took 5 to 10 times float32's time for one query over a cache on an AVX-512 BF16
EPYC, where its products take 1.1 and 0.6 times).

A host profile (``--host-profile``, ``tables/host_profiles.py``) stands in for both
measurements with the answers of the CPU it names, whatever this one is.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import platform
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import torch

from .. import torch_names
from ..kernels import packed_linear
from ..tables.host_profiles import MEASURED, PROFILES
from . import timing
from .timing import UNSTALLED, Stopwatch

log = logging.getLogger(__name__)

_X86 = ("x86_64", "amd64", "i386", "i686")
_CALIBRATION_SIZE = 192
_FAST_WITHIN = 1.25          # a dtype at most this much slower than float32 is fast


def _kernels() -> str:
    """The instruction set torch's CPU kernels run (``ATEN_CPU_CAPABILITY`` may pin a narrower
    one than the CPU has)."""
    return torch.backends.cpu.get_cpu_capability() if hasattr(torch.backends, "cpu") else "unknown"


def describe_profile(profile: str) -> str:
    """One line for ``cudashim doctor``: the host profile and torch's kernels in effect."""
    capability = _kernels()
    pinned = os.environ.get("ATEN_CPU_CAPABILITY")
    kernels = f"torch's kernels: {capability}" + (f" (ATEN_CPU_CAPABILITY={pinned})" if pinned else "")
    if profile == MEASURED:
        return f"host profile: measured on this CPU ({_flags_key() or 'no reduced-precision flags'}); {kernels}"
    return f"host profile: {profile}, {PROFILES[profile][0]} (--host-profile); {kernels}"


@functools.lru_cache(maxsize=None)
def speeds(profile: str = MEASURED) -> Tuple[Dict[torch.dtype, bool], str]:
    """({float16: fast?, bfloat16: fast?}, how that is known)."""
    if profile != MEASURED:
        _, fast, _, _ = PROFILES[profile]
        return ({torch.float16: fast["float16"], torch.bfloat16: fast["bfloat16"]},
                f"host profile '{profile}'")
    if platform.machine().lower() in _X86:
        return _from_instruction_set(), "from the CPU's instruction set" + _float16_units()
    return _calibrated()


# torch.cpu's private probes and the /proc/cpuinfo flag each stands for: a torch without a probe
# (torch 2.5 has no _is_amx_fp16_supported) is answered by the flag (torch_names).
_PROBES = {"avx512_bf16": "_is_avx512_bf16_supported", "amx_tile": "_is_amx_tile_supported",
           "amx_fp16": "_is_amx_fp16_supported"}


def _has(feature: str) -> bool:
    probe = torch_names.get(f"torch.cpu.{_PROBES[feature]}", None)
    if probe is not None:
        return bool(probe())
    return feature in _cpu_flags().split()


def _from_instruction_set() -> Dict[torch.dtype, bool]:
    bfloat16 = _has("avx512_bf16") or _has("amx_tile")
    # AMX-FP16 computes float16 products on the tiles bfloat16's use. AVX512-FP16 alone leaves
    # them at float32's speed (the module's docstring): not fast.
    float16 = _has("amx_fp16")
    return {torch.float16: bool(float16), torch.bfloat16: bool(bfloat16)}


def _float16_units() -> str:
    """What the instruction set answer rests on, where a flag would suggest otherwise."""
    if "avx512_fp16" in _cpu_flags().split() and not _has("amx_fp16"):
        return ": AVX512-FP16 without AMX-FP16 computes float16 products at float32's speed"
    return ""


def _cpu_flags() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            return next((line for line in info if line.startswith("flags")), "")
    except OSError:
        return ""


CACHE_DIR = "CUDASHIM_CACHE_DIR"


def cache_file(name: str = "cpu-dtype-speed.json") -> Path:
    if os.environ.get(CACHE_DIR):
        return Path(os.environ[CACHE_DIR], name)
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root, "cudashim", name)


# The key an answer timed while other work held the CPU is kept under, beside the key it would
# be kept under for good (which older releases read, and never find it under).
PROVISIONAL = " (provisional: timed while other work held the CPU)"


def _cached(path: Path, key: str, measure) -> Tuple[dict, str]:
    """``measure(stopwatch)``'s answer for ``key`` and where it is kept: read from ``path``
    where a process measured it before, else measured and written there (atomically: no reader
    sees half a file).

    An answer timed while other work held the CPU is kept as provisional: the processes after
    it read it while the CPU is still shared (timing it again beside the same load would cost
    each of them seconds and choose no better), and the first to find the CPU free times it
    again and keeps that answer for good."""
    table = _read_table(path)
    if key in table:
        return table[key], f"cached in {path}"
    provisional = table.get(key + PROVISIONAL)
    if provisional is not None and not _cpu_free_now():
        return provisional, (f"provisional in {path}: timed while other work held the CPU, timed "
                             f"again by a program that starts on a free one")
    stopwatch = Stopwatch()
    answer = measure(stopwatch)
    if stopwatch.contended:
        log.info("cudashim: other work held this CPU while %s was timed (%d calls stalled): the "
                 "answer is kept as provisional, and timed again when a program starts on a free "
                 "CPU", key, stopwatch.contended_calls)
        kept = _keep(path, key + PROVISIONAL, answer, drop=None)
        return answer, (f"provisional in {path}: timed while other work held the CPU, timed again "
                        f"by a program that starts on a free one" if kept is None else
                        f"not cached: other work held the CPU while it was timed, and {kept}")
    kept = _keep(path, key, answer, drop=key + PROVISIONAL)
    return answer, f"cached in {path}" if kept is None else f"not cached: {kept}"


def _read_table(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _keep(path: Path, key: str, answer: dict, drop: Optional[str]) -> Optional[str]:
    """Write ``answer`` under ``key`` (and remove ``drop``) in the table at ``path``; None, or
    why it could not."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        table = _read_table(path)
        table[key] = answer
        table.pop(drop, None)
        temporary = path.with_suffix(f".{os.getpid()}.tmp")
        temporary.write_text(json.dumps(table, indent=1))
        temporary.replace(path)
    except OSError as exc:
        log.debug("cudashim: %s is not cached (%s)", key, exc)
        return str(exc)
    return None


@functools.lru_cache(maxsize=1)
def _cpu_free_now() -> bool:
    """Whether this process starts on a CPU of its own: asked once a process, for all its tables.
    A probe is a moment: beside two busy loops on 2 CPUs, one start in four or five here found
    a CPU free (the scheduler had put both loops on the other) and timed the tables again, which
    the loops then held up; that answer is kept as provisional too."""
    return timing.cpu_is_free()


def _calibrated() -> Tuple[Dict[torch.dtype, bool], str]:
    # The rule in the key: an answer cached before float16 was held against bfloat16 is timed again.
    key = (f"{platform.machine()} {platform.processor()} {os.cpu_count()} cpus, torch {torch.__version__}, "
           f"float16 against float32 and bfloat16, {UNSTALLED}")
    cached, kept = _cached(cache_file(), key, _measure)
    return ({torch.float16: cached["float16"], torch.bfloat16: cached["bfloat16"]},
            f"calibrated on this machine ({kept})")


# --- explicit float16 matmuls ------------------------------------------------------------
_WIDTH = 1024                    # a weight of 1024 x 1024: larger than the caches closest to a core
_MEMORY_BOUND_ROWS = 2           # decoding: batches of 1-4
_COMPUTE_BOUND_ROWS = 256        # training and prefill
_PREFER_WITHIN = 1.05            # a more precise choice this close to the fastest is kept
# What the policy's path costs a converting call (bfloat16 or float32) beyond the conversions the
# table times, in a program, between its products: the time counted against those choices. A
# decoding step of 1024-wide layers, 2 rows, took 55 us a call more computed in bfloat16 than as
# asked on an AVX-512 BF16 EPYC, where the table timed bfloat16 20 us faster (0.06 against 0.08 ms).
_CONVERTING_CALL_MS = 0.05
# What a second kept copy of every weight costs a memory-bound call, as a factor of its time: a
# choice for decoding that converts into another dtype than the compute-bound class's keeps a copy
# of each weight beside that class's (a prefill's), and a model's weights, read once a token, then
# share the caches with twice as much. On a Xeon with AMX-BF16 and a 105 MB cache, a decoder of
# 1024-wide blocks (benchmarks/programs/decode.py) that decoded in float32 beside its prefill's
# bfloat16 copies ran 1.21 to 1.32 times its bfloat16 port, decoding in bfloat16 1.10 to 1.11,
# where the table timed the two products within 8% of each other, the faster either.
_SECOND_COPY = 1.15


@functools.lru_cache(maxsize=None)
def matmul_choices(profile: str = MEASURED):
    """What explicit float16 matmuls compute in on this CPU, by shape class, or on the host
    profile's CPU: as asked where float16 is fast; else measured once per CPU, thread count and
    torch version (cached)."""
    from ..precision import MatmulChoices
    fast, how_known = speeds(profile)
    if fast[torch.float16]:                  # float16 as asked: nothing to choose, nothing to time
        return MatmulChoices.from_dtype_speeds(fast, how_known)
    if profile != MEASURED:
        _, _, choices, attention = PROFILES[profile]
        how_known = f"host profile '{profile}'"
        return MatmulChoices(*choices, how_known, attention=MatmulChoices(*attention, how_known))
    # torch's kernels in the key (the same CPU under ATEN_CPU_CAPABILITY=avx2 computes float16
    # at AVX2's speed); the passes and the stopwatch: an answer timed in fewer passes, or with
    # the turns other work held up counted, which a stall may have decided, is timed again.
    key = (f"{_cpu_model()} [{_flags_key()}], {_kernels()} kernels, "
           f"{torch.get_num_threads()} threads, torch {torch.__version__}, {_MATMUL_PASSES} passes, "
           f"{_CONVERTING_CALL_MS} ms a converting call, {UNSTALLED}")
    # the memory-bound class's weights streamed: an answer timed on one weight kept in the cache
    # is timed again
    matmul_key = f"{key}, memory-bound over {_streamed_blocks()} decoder blocks of {_WIDTH}"
    if packed_linear.not_offered() is None:     # bfloat16 timed as the policy then computes it
        matmul_key += ", bfloat16 on weights packed for oneDNN"
    cached, kept = _cached(cache_file("float16-matmuls.json"), matmul_key, _measure_matmuls)
    how_known = f"measured on this CPU, {torch.get_num_threads()} threads; {kept}"
    attention, kept = _cached(cache_file("float16-attention.json"), key, _measure_attention)
    return MatmulChoices(cached["memory_bound"], cached["compute_bound"], cached["memory_bound_rows"],
                         how_known, cached["timings"], MatmulChoices(
                             attention["memory_bound"], attention["compute_bound"],
                             attention["memory_bound_rows"],
                             f"measured on this CPU, {torch.get_num_threads()} threads; {kept}",
                             attention["timings"]))


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.partition(":")[2].strip()
    except OSError:
        pass
    return f"{platform.machine()} {platform.processor()}".strip()


def _flags_key() -> str:
    """The flags that decide the speed of reduced-precision arithmetic."""
    have = set(_cpu_flags().split())
    return " ".join(f for f in ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16",
                                "amx_bf16", "amx_fp16") if f in have)


def _last_level_cache_bytes() -> int:
    """The size of the largest cache one core reads through (sysfs; ``_ASSUMED_CACHE`` where the
    system does not say), at most ``_LARGEST_CACHE``."""
    largest = 0
    for index in _CACHES.glob("index*"):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1:].upper(), 1)
        digits = size.rstrip("KMGkmg")
        if digits.isdigit():
            largest = max(largest, int(digits) * scale)
    return min(largest or _ASSUMED_CACHE, _LARGEST_CACHE)


# The memory-bound class's set of weights: decoder blocks of _WIDTH (a fused query/key/value
# projection, the output projection, the MLP's up and down ones), as many as hold more float32
# than the last-level cache. A decoder's weights are read once a token, from memory, where a
# single weight timed again and again stays in the cache: on a Xeon with a 105 MB cache, a
# 1024 x 1024 weight read that way took 0.12 ms in float32 and 0.19 in bfloat16 (2 rows), read
# among 96 to 288 MB of others 0.23 to 0.25 in both; a decoder's prefill then kept bfloat16
# copies and its decoding float32 ones beside them, together three times its float16 weights.
_BLOCK_SHAPES = ((3 * _WIDTH, _WIDTH), (_WIDTH, _WIDTH), (4 * _WIDTH, _WIDTH), (_WIDTH, 4 * _WIDTH))
_CACHES = Path("/sys/devices/system/cpu/cpu0/cache")      # index0 ... with a "size" each: "107520K"
_ASSUMED_CACHE = 32 * 2**20
_LARGEST_CACHE = 256 * 2**20     # the transient set: at most twice this in float32, once in each other


def _streamed_blocks() -> int:
    """How many decoder blocks the memory-bound class's weights hold: float32 beyond the cache,
    while the three choices' sets (8 bytes a weight) take at most a thirty-second of the memory
    (every rank of a job on a fresh machine times them at once)."""
    weights = sum(out * into for out, into in _BLOCK_SHAPES)
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):       # no sysconf (Windows): as much as the cache asks
        memory = None
    blocks = -(-_last_level_cache_bytes() // (4 * weights))
    return blocks if memory is None else max(1, min(blocks, memory // 32 // (8 * weights)))


def _streamed_call(rows: int, choice: str):
    """A pass of ``rows`` float16 rows through ``_streamed_blocks()`` decoder blocks, each product
    computed as ``choice`` does (weights converted beforehand, as they are kept:
    ``_kept_as_the_policy_keeps``; the rows on every call). Its ``products``: how many products a pass computes, which its time is divided by."""
    from ..precision import AS_ASKED, BFLOAT16
    linear = torch._C._nn.linear
    numbers = torch.Generator().manual_seed(0)
    block = [torch.randn(shape, generator=numbers).half() for shape in _BLOCK_SHAPES]
    x = torch.randn(rows, 4 * _WIDTH, generator=numbers).half()
    blocks = _streamed_blocks()
    inputs = [x[:, :weight.shape[1]].contiguous() for weight in block] * blocks
    if choice == AS_ASKED:
        weights = [weight.clone() for _ in range(blocks) for weight in block]

        def streamed():
            for weight, rows_in in zip(weights, inputs):
                linear(rows_in, weight)
    else:
        dtype = torch.bfloat16 if choice == BFLOAT16 else torch.float32
        linear, keep = _kept_as_the_policy_keeps(dtype)
        weights = [keep(weight.to(dtype)) for _ in range(blocks) for weight in block]

        def streamed():
            for weight, rows_in in zip(weights, inputs):
                linear(rows_in.to(dtype), weight).half()
    streamed.products = len(weights)
    return streamed


def _kept_as_the_policy_keeps(dtype):
    """(linear, keep): a layer's product in ``dtype`` and how its weight is kept for it, as the
    policy computes it: in bfloat16 on a weight packed for oneDNN where that runs here
    (``kernels.packed_linear``), else torch's own linear on a plain copy. torch's C function:
    F.linear may be the policy's patched one by now."""
    if dtype is torch.bfloat16 and packed_linear.usable():
        return (lambda x, weight: packed_linear.linear(x, weight, None)), packed_linear.pack
    return torch._C._nn.linear, (lambda weight: weight)


def _choice_call(rows: int, choice: str):
    """One F.linear of ``rows`` float16 rows by a 1024 x 1024 float16 weight, computed as
    ``choice`` does (the weight converted beforehand, as it is kept:
    ``_kept_as_the_policy_keeps``). torch's own C function: F.linear may be the policy's patched
    one by now."""
    from ..precision import AS_ASKED, BFLOAT16
    linear = torch._C._nn.linear
    numbers = torch.Generator().manual_seed(0)         # the program's own generator untouched
    x = torch.randn(rows, _WIDTH, generator=numbers).half()
    weight = torch.randn(_WIDTH, _WIDTH, generator=numbers).half()
    if choice == AS_ASKED:
        return lambda: linear(x, weight)
    dtype = torch.bfloat16 if choice == BFLOAT16 else torch.float32
    linear, keep = _kept_as_the_policy_keeps(dtype)
    kept = keep(weight.to(dtype))
    return lambda: linear(x.to(dtype), kept).half()


# Attention as the classes time it: a batch of 2 of 8 heads of 64, one query a row over a cache
# of this many positions (decoding), or as many queries as positions, causal (a prefill).
_ATTENTION_CACHE = 256


def _attention_call(rows: int, choice: str):
    """One scaled_dot_product_attention of ``rows`` float16 queries a head, computed as
    ``choice`` does: query, keys and values converted on every call into buffers kept between
    calls (the policy's ``ConversionScratch``), the result rounded to float16. torch's own C
    function, as ``_choice_call`` takes."""
    from ..precision import AS_ASKED, BFLOAT16
    attention = torch._C._nn.scaled_dot_product_attention
    numbers = torch.Generator().manual_seed(0)
    positions = max(rows, _ATTENTION_CACHE)
    q = torch.randn(2, 8, rows, 64, generator=numbers).half()
    k, v = (torch.randn(2, 8, positions, 64, generator=numbers).half() for _ in range(2))
    causal = rows == positions
    if choice == AS_ASKED:
        return lambda: attention(q, k, v, is_causal=causal)
    dtype = torch.bfloat16 if choice == BFLOAT16 else torch.float32
    wide = [torch.empty(t.shape, dtype=dtype) for t in (q, k, v)]

    def converted_and_rounded():
        for buffer, tensor in zip(wide, (q, k, v)):
            _converted_into(tensor, buffer)
        return attention(*wide, is_causal=causal).half()
    return converted_and_rounded


def _converted_into(tensor, buffer):
    """``tensor`` (float16) converted into ``buffer``, as the policy converts an operand: in one
    pass into bfloat16 where the compiled conversion runs, else by way of float32."""
    from ..kernels import native
    if buffer.dtype is torch.bfloat16:
        if not (native.usable() and native.converted_into(tensor, buffer, torch.bfloat16)):
            buffer.copy_(tensor.float())
    else:
        buffer.copy_(tensor)


def _time_choices(stopwatch: Stopwatch, rows: int, choices, passes: int = 1,
                  call=None) -> Dict[str, float]:
    """The best milliseconds of each choice at ``rows`` rows over ``passes`` passes, the choices
    taking turns in each. ``call``: what builds a call of a choice (``_choice_call``). A choice
    torch cannot compute here is left out, and never chosen."""
    calls = {choice: (call or _choice_call)(rows, choice) for choice in choices}
    calls = {choice: built for choice, built in calls.items() if _runs(choice, built)}
    best = [float("inf")] * len(calls)
    for _ in range(passes):
        best = [min(pair) for pair in zip(best, stopwatch.best_of_turns(*calls.values()))]
    # a call of several products (``_streamed_call``): the time of one
    return {choice: time / getattr(built, "products", 1)
            for (choice, built), time in zip(calls.items(), best)}


def _runs(choice: str, call) -> bool:
    """Whether ``call`` runs. torch's kernels pinned below what the CPU has can refuse a dtype:
    with ``ATEN_CPU_CAPABILITY=default`` on a CPU with AMX, torch 2.13's bfloat16 attention
    raises "pack_vnni2 is only supported when avx512 is supported"."""
    try:
        call()
    except RuntimeError as exc:
        log.info("cudashim: %s does not run here, so it is not among the choices (%s)", choice, exc)
        return False
    return True


# The two shape classes are each timed in this many passes, each choice's best over them
# deciding: a stall of the machine through every turn of one pass (about a second at 256 rows
# on an AVX-512 EPYC) would otherwise decide the class's choice for good, as it once decided
# two of the other ops' (``_OP_PASSES``). A pass more costs about a second, once per CPU,
# thread count and torch. The search for the classes' boundary takes one pass: a stall there
# moves the boundary by a doubling, not a class's choice.
_MATMUL_PASSES = 2


def _in_a_program(times: Dict[str, float], copies_kept: str = None) -> Dict[str, float]:
    """The times a call of each choice takes in a program: a converting one costs
    ``_CONVERTING_CALL_MS`` more than timed. ``copies_kept``: the choice whose copies of the
    weights the program keeps anyway (the compute-bound class's); another converting choice
    keeps a second copy of every weight, and counts ``_SECOND_COPY`` times its time."""
    from ..precision import AS_ASKED
    in_a_program = {}
    for choice, time in times.items():
        if choice != AS_ASKED:
            time += _CONVERTING_CALL_MS
            if copies_kept is not None and choice != copies_kept:
                time *= _SECOND_COPY
        in_a_program[choice] = time
    return in_a_program


def _fastest(times: Dict[str, float], copies_kept: str = None) -> str:
    """The fastest choice in a program (``_in_a_program``), unless a more precise one is within
    _PREFER_WITHIN of it."""
    from ..precision import AS_ASKED, BFLOAT16, FLOAT32
    times = _in_a_program(times, copies_kept)
    best = min(times.values())
    return next(choice for choice in (FLOAT32, AS_ASKED, BFLOAT16)
                if choice in times and times[choice] <= best * _PREFER_WITHIN)


def _measure_matmuls(stopwatch: Stopwatch) -> dict:
    measured = _measure_classes(stopwatch, _choice_call, streamed=_streamed_call)
    weights = _streamed_blocks() * sum(out * into for out, into in _BLOCK_SHAPES)
    measured["timings"]["memory-bound"]["streamed"] = f"{weights * 2 / 2**20:.0f} MB of float16 weights"
    return measured


def _measure_attention(stopwatch: Stopwatch) -> dict:
    return _measure_classes(stopwatch, _attention_call)


def _measure_classes(stopwatch: Stopwatch, call, streamed=None) -> dict:
    """Both shape classes of the calls ``call`` builds timed in each choice, and the boundary
    between them. ``streamed``: what builds the memory-bound class's calls instead, from weights
    the choices keep copies of (the products'): a choice there that keeps copies other than the
    compute-bound class's keeps a second copy of each weight, which counts against it."""
    from ..precision import AS_ASKED, BFLOAT16, FLOAT32
    choices = (AS_ASKED, BFLOAT16, FLOAT32)
    memory_call = streamed or call
    with torch.no_grad():
        memory = _time_choices(stopwatch, _MEMORY_BOUND_ROWS, choices, _MATMUL_PASSES, memory_call)
        compute = _time_choices(stopwatch, _COMPUTE_BOUND_ROWS, choices, _MATMUL_PASSES, call)
        compute_choice = _fastest(compute)
        copies_kept = compute_choice if streamed else None
        memory_choice = _fastest(memory, copies_kept)
        # Where the classes differ, the memory-bound choice holds up to the largest row count
        # (doubling from the decoding batch) at which it still beats the compute-bound one.
        rows = _MEMORY_BOUND_ROWS
        if memory_choice != compute_choice:
            while rows * 2 < _COMPUTE_BOUND_ROWS:
                times = _in_a_program(_time_choices(stopwatch, rows * 2, (memory_choice, compute_choice),
                                                    call=memory_call), copies_kept)
                if times[memory_choice] >= times[compute_choice]:
                    break
                rows *= 2
        else:
            rows = _COMPUTE_BOUND_ROWS
    return {"memory_bound": memory_choice, "compute_bound": compute_choice, "memory_bound_rows": rows,
            "timings": {"memory-bound": {**memory, "rows": _MEMORY_BOUND_ROWS},
                        "compute-bound": {**compute, "rows": _COMPUTE_BOUND_ROWS}}}


# --- the other float16 ops ---------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def op_choices(profile: str = MEASURED) -> Dict[str, dict]:
    """What the float16 ops outside the matmul family (``tables/float16_ops.py``) compute in on
    this CPU: {op: {"choice": "as-asked" or "float32", "as-asked": ms, "float32": ms,
    "widened_up_to": elements or None, ...}}, each timed both ways once per CPU, thread count
    and torch version (cached), a widened op on grown samples too. Empty where float16
    is fast, and under a host profile, which stands for the matmul table: each op as asked."""
    fast, _ = speeds(profile)
    if fast[torch.float16] or profile != MEASURED:
        return {}
    from ..tables.float16_ops import GROWN_SCALES, OPS
    # The table's ops in the key: an op added later is timed, not missing from an older answer;
    # and its passes and stopwatch: an answer timed in fewer passes, or with the turns other work
    # held up counted, which a stall may have decided, is timed again; and torch's kernels; and
    # the sizes a widened op is timed on, so that an answer without its largest is timed again.
    key = (f"{_cpu_model()} [{_flags_key()}], {_kernels()} kernels, "
           f"{torch.get_num_threads()} threads, torch {torch.__version__}, ops {' '.join(OPS)}, "
           f"{_OP_PASSES} passes, grown to {max(GROWN_SCALES)}x, {UNSTALLED}")
    timed, _ = _cached(cache_file("float16-ops.json"), key, _measure_ops)
    # Decided from the timings on every read: a margin changed since they were cached holds.
    from ..precision import FLOAT32
    read = {}
    for name, times in timed.items():
        choice = _op_choice(times)
        read[name] = {**times, "choice": choice,
                      "widened_up_to": _widened_up_to(times) if choice == FLOAT32 else None}
    return read


def _op_choice(times: dict) -> str:
    """float32 where it beat float16 by ``WIDEN_BELOW``'s margin, else as asked."""
    from ..precision import AS_ASKED, FLOAT32
    from ..tables.float16_ops import WIDEN_BELOW
    return FLOAT32 if times[FLOAT32] < WIDEN_BELOW * times[AS_ASKED] else AS_ASKED


def _widened_up_to(times: dict) -> Optional[int]:
    """The largest input, in elements, at which a widened op is computed in float32: the
    largest grown size at which it still won below the first at which it lost (the sample's
    own where it lost at the first, or was not grown: widened by a margin lowered since it was
    timed); None where it lost at none (every size widened)."""
    from ..tables.float16_ops import WIDEN_BELOW
    ceiling = times.get("elements")
    if "grown" not in times:
        return ceiling
    for elements, asked, widened in sorted(times["grown"]):
        if not widened < WIDEN_BELOW * asked:
            return ceiling
        ceiling = elements
    return None


# The table is timed in this many passes over its ops, each op's best time taken over them: a
# stall of the machine (memory reclaim, another job) can last through every turn of one op, and
# a choice is cached for good. One pass on a loaded AVX-512 EPYC timed gelu and log_softmax at
# 12 ms as asked and 36 ms widened, a hundred times what they take (0.1 ms both ways).
_OP_PASSES = 2


def _measure_ops(stopwatch: Stopwatch) -> Dict[str, dict]:
    """Each op of the table on its sample, float16 as asked against widened to float32 and
    narrowed back (the conversions counted), the two taking turns, in ``_OP_PASSES`` passes
    over the table. torch's own functions: the precision patches may be installed by now, but
    not yet over these."""
    from ..precision import AS_ASKED, FLOAT32
    from ..tables.float16_ops import OPS, SAMPLES, places
    numbers = torch.Generator().manual_seed(0)         # the program's own generator untouched
    samples = {kind: torch.randn(shape, generator=numbers).half() for kind, shape in SAMPLES.items()}
    ops = {}
    for name, (kind, rest) in OPS.items():
        found = places(name)
        if found:                                       # no rms_norm before torch 2.4
            owner, attribute, _ = found[0]
            if _has_a_float16_kernel(getattr(owner, attribute), samples[kind], rest):
                ops[name] = (getattr(owner, attribute), samples[kind], rest)
    best = {name: [float("inf"), float("inf")] for name in ops}
    with torch.no_grad():
        for _ in range(_OP_PASSES):
            for name, (op, x, rest) in ops.items():
                timed = stopwatch.best_of_turns(*_both_ways(op, x, rest))
                best[name] = [min(pair) for pair in zip(best[name], timed)]
        measured = {}
        for name, (asked, wide) in best.items():
            op, x, rest = ops[name]
            measured[name] = {"choice": _op_choice({AS_ASKED: asked, FLOAT32: wide}), AS_ASKED: asked,
                              FLOAT32: wide, "elements": x.numel()}
            if measured[name]["choice"] == FLOAT32:
                measured[name]["grown"] = _grown_timings(stopwatch, op, x, rest)
    return measured


def _has_a_float16_kernel(op, x, rest) -> bool:
    """Whether this torch computes ``op`` in float16 on the host at all: torch 2.4 has no float16
    grid_sample there ("grid_sampler_2d_cpu not implemented for Half"). Such an op is left out
    of the table; the kernel-gap group serves its float16 calls."""
    as_asked, _ = _both_ways(op, x, rest)
    try:
        with torch.no_grad():
            as_asked()
    except (RuntimeError, NotImplementedError):
        return False
    return True


def _both_ways(op, x, rest):
    """``op`` on ``x`` as asked, and widened to float32 and narrowed back (an ``Operand`` among
    ``rest``, made from ``x``, converted as a second operand is); each call says how many
    elements it reads (``elements``), for a stopwatch that answers by size."""
    from ..tables.float16_ops import Operand
    arguments = [value.of(x) if isinstance(value, Operand) else value for value in rest]
    operands = [index for index, value in enumerate(rest) if isinstance(value, Operand)]

    def as_asked():
        return op(x, *arguments)

    def widened():
        wide = list(arguments)
        for index in operands:
            wide[index] = arguments[index].float()
        return op(x.float(), *wide).half()
    as_asked.elements = widened.elements = x.numel()
    return as_asked, widened


# Each grown size is timed once (it is bisected, up to three sizes an op), in fewer turns than the
# sample: at the largest one call takes tens of milliseconds, and near the size where the two
# ways cross, whichever is chosen costs about the same.
_GROWN_TURNS = 3


def _grown_timings(stopwatch: Stopwatch, op, x: torch.Tensor, rest) -> List[list]:
    """[[elements, as asked ms, float32 ms]] for ``op`` on ``x`` grown along its leading
    dimension (``GROWN_SCALES``): the largest first, and where float32 lost there, bisected for
    the largest at which it still wins."""
    from ..tables.float16_ops import GROWN_SCALES, WIDEN_BELOW
    timed = {}

    def won_at(index):
        grown = x.repeat(GROWN_SCALES[index], *([1] * (x.dim() - 1)))
        asked, wide = stopwatch.best_of_turns(*_both_ways(op, grown, rest), turns=_GROWN_TURNS)
        timed[index] = [grown.numel(), asked, wide]
        return wide < WIDEN_BELOW * asked

    won, lost = -1, len(GROWN_SCALES) - 1       # -1: the sample, where it won
    if not won_at(lost):
        while lost - won > 1:
            middle = (won + lost) // 2
            if won_at(middle):
                won = middle
            else:
                lost = middle
    return [timed[index] for index in sorted(timed)]


def _measure(stopwatch: Stopwatch) -> Dict[str, bool]:
    """Time one small matmul per dtype; fast is at most ``_FAST_WITHIN`` times float32's time,
    and, for float16, at most that times bfloat16's too: a float16 that a faster bfloat16 stands
    beside is left to the measured choices, as on x86 (``_from_instruction_set``)."""
    numbers = torch.Generator().manual_seed(0)         # the program's own generator untouched
    a = torch.randn(_CALIBRATION_SIZE, _CALIBRATION_SIZE, generator=numbers)
    operands = [a.to(dtype) for dtype in (torch.float32, torch.float16, torch.bfloat16)]
    float32, float16, bfloat16 = stopwatch.best_of_turns(*(lambda m=m: m @ m for m in operands), turns=3)
    return {"float16": float16 <= _FAST_WITHIN * min(float32, bfloat16),
            "bfloat16": bfloat16 <= _FAST_WITHIN * float32}
