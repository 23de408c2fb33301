"""cudashim.kernels against their references, as ratios measured in one run.

    python benchmarks/kernels.py [--json benchmarks/results-kernels.json] [--repeats 15] [--no-link]

1. packbits / unpackbits on 64 Mi bits (the CPU's fast path) versus numpy.packbits /
   unpackbits; target: at least numpy's speed;
2. the compression work of compressed_allreduce (sign, scale, pack, unpack, error feedback)
   on 16 Mi elements, compiled versus the portable torch version; target: 5x;
3. compressed_allreduce versus a float32 all_reduce of the same 16 Mi-element buffer on 2
   gloo ranks over this machine's loopback: time per call, and the bytes each rank sends;
4. the same on a link shaped like a real one (benchmarks/shaped_link.py: a network namespace
   whose loopback is a tbf token bucket at 10 Gbit/s, then 1 Gbit/s); targets: faster than
   float32 at 10 Gbit/s, 4x faster at 1 Gbit/s.
"""

import argparse
import json
import os
import sys
import tempfile

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from cudashim.kernels import CompressedBackend, bits, error_buffer_size, native  # noqa: E402
from cudashim.kernels import compressed  # noqa: E402
import host  # noqa: E402
import shaped_link  # noqa: E402
from measure import speed, summary, timed, verdict  # noqa: E402

BITS = 64 * 2 ** 20
ELEMENTS = 16 * 2 ** 20


def runnable_variants():
    """The host-kernel variants this CPU runs, the chosen one first."""
    chosen = native.variant()
    others = [v.name for v in native.variants() if v.runs_here and v.name != chosen]
    return ([chosen] if chosen else []) + others


def in_variant(name, function):
    def run():
        with native.using_variant(name):
            return function()
    return run


def portable(function):
    def run():
        with native.portable_only():
            return function()
    return run


def thread_counts():
    return sorted({1, min(2, os.cpu_count() or 1)})


def row(what, threads, samples, references, target):
    """One table row: the chosen variant against each reference (all taking turns)."""
    variants = runnable_variants()
    mine = samples[variants[0]]
    speeds = {name: speed(samples[name], mine) for name in references}
    verdicts = [verdict(ratio, target) for ratio in speeds.values()]
    met = ("yes" if all(v == "yes" for v in verdicts) else
           "no" if "no" in verdicts else "unresolved (target within the spread)")
    return {"what": what, "threads": threads, "variant": variants[0],
            "timings": {name: summary(values) for name, values in samples.items()},
            "references": list(references), "speeds": speeds, "target": target, "met": met}


def bit_rows(repeats):
    bits_in = torch.rand(BITS) < 0.5
    array = bits_in.numpy()
    packed_array = np.packbits(array)
    packed = torch.from_numpy(packed_array)
    assert np.array_equal(native.packbits(bits_in).numpy(), packed_array)
    rows = []
    saved = torch.get_num_threads()
    for threads in thread_counts():
        torch.set_num_threads(threads)
        for name, ours, numpy_version, torch_version in (
                ("packbits, 64 Mi bits", lambda: native.packbits(bits_in), lambda: np.packbits(array),
                 lambda: bits.packbits(bits_in)),
                ("unpackbits, 64 Mi bits", lambda: native.unpackbits(packed), lambda: np.unpackbits(packed_array),
                 lambda: bits.unpackbits(packed))):
            functions = {variant: in_variant(variant, ours) for variant in runnable_variants()}
            functions.update({"numpy": numpy_version, "portable": torch_version})
            rows.append(row(name, threads, timed(functions, repeats), ("numpy", "portable"), 1.0))
    torch.set_num_threads(saved)
    return rows


def compression_work(buffer, worker_error, server_error, world=2):
    """Everything compressed_allreduce computes for one rank of ``world``, without sending:
    compensate and compress, average the signs received (here: this rank's own, world
    times), compress the server chunk, expand every chunk back into the buffer."""
    scale, packed = compressed.compensate_and_compress(buffer, worker_error)
    server_scale, server_packed = compressed.server_compress(packed, scale.reshape(1).repeat(world),
                                                             server_error)
    compressed.expand_into(buffer, server_packed.repeat(world), server_scale.reshape(1).repeat(world))


def compression_rows(repeats, world=2):
    torch.manual_seed(0)
    buffer = torch.randn(ELEMENTS)
    size = error_buffer_size(ELEMENTS, world)

    def fresh():
        return buffer.clone(), torch.zeros(size), torch.zeros(size // world)

    def run(state):
        return lambda: compression_work(*state)

    portable_state = fresh()
    portable(run(portable_state))()
    compiled_state = fresh()
    run(compiled_state)()
    # One call from the same state: the two paths agree to float32 summation error. The
    # scale differs most: torch's float32 norm of 16 Mi squares drifts by ~1e-3 relative,
    # the compiled sum (float lanes folded into a double) matches a float64 norm.
    for mine, theirs in zip(compiled_state, portable_state):
        assert torch.allclose(mine, theirs, rtol=2e-3, atol=2e-3), "compiled and portable disagree"
    rows = []
    saved = torch.get_num_threads()
    for threads in thread_counts():
        torch.set_num_threads(threads)
        functions = {variant: in_variant(variant, run(fresh())) for variant in runnable_variants()}
        functions["portable"] = portable(run(fresh()))
        rows.append(row("compression work, 16 Mi float32", threads, timed(functions, repeats),
                        ("portable",), 5.0))
    torch.set_num_threads(saved)
    return rows


def _rank(rank, world, init_method, repeats, out):
    # Each rank gets its share of the cores, as torchrun gives it (OMP_NUM_THREADS=1 for
    # several ranks a node): two ranks with two threads each would fight over two cores.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    torch.manual_seed(rank)
    buffer = torch.randn(ELEMENTS)
    backend = CompressedBackend()
    size = error_buffer_size(ELEMENTS, world)
    worker_error, server_error = torch.zeros(size), torch.zeros(size // world)

    def synchronised(function):
        def run():
            dist.barrier()
            function()
        return run

    # Both ranks take the same turns, so each collective meets its partner.
    samples = timed({"compressed": synchronised(lambda: backend.compressed_allreduce(buffer, worker_error, server_error)),
                     "plain": synchronised(lambda: dist.all_reduce(buffer))}, repeats)
    if rank == 0:
        torch.save(samples, out)
    dist.destroy_process_group()


def allreduce_row(repeats, world=2, init_method=None, link="this machine's loopback", target=None):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "timings.pt")
        mp.spawn(_rank, args=(world, init_method or f"file://{tmp}/store", repeats, out),
                 nprocs=world, join=True)
        samples = torch.load(out)
    plain_bytes = 2 * (world - 1) * ELEMENTS * 4 // world     # ring all_reduce payload per rank
    compressed_bytes = CompressedBackend.wire_bytes(ELEMENTS, world)
    return finish_allreduce_row({
        "what": f"allreduce, 16 Mi float32, {world} gloo ranks, {link}", "threads": 1,
        "variant": native.variant(), "samples": samples, "references": ["plain"],
        "wire_bytes_per_rank": {"cudashim": compressed_bytes, "reference": plain_bytes,
                                "ratio": plain_bytes / compressed_bytes}}, target)


def finish_allreduce_row(found, target):
    """The row's speeds and verdict, once its target is known (the shaped rows set theirs)."""
    samples = found["samples"]
    found["timings"] = {name: summary(values) for name, values in samples.items()}
    found["speeds"] = {"plain": speed(samples["plain"], samples["compressed"])}
    found["target"] = target
    found["met"] = verdict(found["speeds"]["plain"], target)
    return found


NAMES = {"numpy": "numpy", "portable": "the portable torch version", "plain": "float32 all_reduce"}


def print_table(rows):
    print(f"{'what':58s} {'thr':>3s} {'ours ms':>9s}  {'against':34s} {'speed':>6s} {'(middle half)':>14s} "
          f"{'target':>6s} met")
    for r in rows:
        ours = r["timings"][r.get("variant") if r.get("variant") in r["timings"] else "compressed"]
        for i, name in enumerate(r["references"]):
            ratio = r["speeds"][name]
            target = "" if r["target"] is None else f"{r['target']:.0f}x"
            label = f"{NAMES[name]} {r['timings'][name]['median_ms']:.1f} ms"
            head = (f"{r['what']:58s} {r['threads']:3d} {ours['median_ms']:9.2f}" if i == 0
                    else f"{'':58s} {'':3s} {'':9s}")
            print(f"{head}  {label:34s} {ratio['median']:5.2f}x {ratio['low']:6.2f}-{ratio['high']:<6.2f} "
                  f"{target:>6s} {r['met'] if i == len(r['references']) - 1 else ''}")
        others = [f"{name} {t['median_ms']:.2f} ms" for name, t in r["timings"].items()
                  if name not in r["references"] and name not in (r.get("variant"), "compressed")]
        if others:
            print(f"{'':58s}     other variants: {', '.join(others)} (chosen: {r['variant']})")
        if "wire_bytes_per_rank" in r:
            w = r["wire_bytes_per_rank"]
            print(f"{'':58s}     bytes on the wire per rank: {w['cudashim']:,} vs {w['reference']:,} "
                  f"({w['ratio']:.1f}x fewer)")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results-kernels.json"))
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--no-link", action="store_true", help="skip the shaped-link rows")
    args = parser.parse_args()
    if native.unavailable():
        sys.exit(f"the compiled kernels do not run here: {native.unavailable()}")
    info = host.describe()
    info.update(numpy=np.__version__, threads=torch.get_num_threads(),
                kernel_variants={v.name: {"needs": v.needs, "runs_here": v.runs_here} for v in native.variants()},
                chosen_variant=native.variant())
    print(host.line(info))
    rows = bit_rows(args.repeats) + compression_rows(args.repeats) + [allreduce_row(max(3, args.repeats // 3))]
    skipped = None
    if not args.no_link:
        link_rows, skipped = shaped_link.rows(max(3, args.repeats // 3))
        rows += link_rows
    print_table(rows)
    if skipped:
        print(f"shaped-link rows skipped: {skipped}")
    for r in rows:
        r.pop("samples", None)
    with open(args.json, "w") as f:
        json.dump({"host": info, "rows": rows, "shaped_link_skipped": skipped}, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
