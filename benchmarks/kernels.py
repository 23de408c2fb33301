"""cudashim.kernels against their references, as ratios measured in one run.

    python benchmarks/kernels.py [--json benchmarks/results-kernels.json] [--repeats 15]

1. portable packbits / unpackbits on 64 Mi bits versus numpy.packbits / unpackbits (CPU);
2. compressed_allreduce versus a float32 all_reduce of the same 16 Mi-element buffer on 2
   gloo ranks: time per call, and the bytes each rank puts on the wire.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from cudashim.kernels import CompressedBackend, error_buffer_size, packbits, unpackbits  # noqa: E402

BITS = 64 * 2 ** 20
ELEMENTS = 16 * 2 ** 20


def timed(function, repeats):
    function()                                         # warm-up
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        samples.append((time.perf_counter() - start) * 1e3)
    return {"median_ms": statistics.median(samples), "min_ms": min(samples), "max_ms": max(samples)}


def bit_rows(repeats):
    bits = torch.rand(BITS) < 0.5
    array = bits.numpy()
    packed = np.packbits(array)
    assert np.array_equal(packbits(bits).numpy(), packed)
    rows = []
    for name, ours, theirs in (
            ("packbits, 64 Mi bits", lambda: packbits(bits), lambda: np.packbits(array)),
            ("unpackbits, 64 Mi bits", lambda: unpackbits(torch.from_numpy(packed)),
             lambda: np.unpackbits(packed))):
        mine, reference = timed(ours, repeats), timed(theirs, repeats)
        rows.append({"what": name, "cudashim": mine, "reference": reference, "reference_name": "numpy",
                     "speed_vs_reference": reference["median_ms"] / mine["median_ms"]})
    return rows


def _rank(rank, world, init_method, repeats, out):
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

    compressed = timed(synchronised(lambda: backend.compressed_allreduce(buffer, worker_error, server_error)), repeats)
    plain = timed(synchronised(lambda: dist.all_reduce(buffer)), repeats)
    if rank == 0:
        torch.save({"compressed": compressed, "plain": plain}, out)
    dist.destroy_process_group()


def allreduce_row(repeats, world=2):
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "timings.pt")
        mp.spawn(_rank, args=(world, f"file://{tmp}/store", repeats, out), nprocs=world, join=True)
        timings = torch.load(out)
    plain_bytes = 2 * (world - 1) * ELEMENTS * 4 // world     # ring all_reduce payload per rank
    compressed_bytes = CompressedBackend.wire_bytes(ELEMENTS, world)
    return {"what": f"allreduce, 16 Mi float32, {world} gloo ranks",
            "cudashim": timings["compressed"], "reference": timings["plain"],
            "reference_name": "float32 all_reduce",
            "speed_vs_reference": timings["plain"]["median_ms"] / timings["compressed"]["median_ms"],
            "wire_bytes_per_rank": {"cudashim": compressed_bytes, "reference": plain_bytes,
                                    "ratio": plain_bytes / compressed_bytes}}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=os.path.join(os.path.dirname(__file__), "results-kernels.json"))
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rows = bit_rows(args.repeats) + [allreduce_row(max(3, args.repeats // 3))]
    print(f"{'what':44s} {'cudashim ms':>12s} {'reference ms':>13s} {'speed':>7s}  reference")
    for r in rows:
        print(f"{r['what']:44s} {r['cudashim']['median_ms']:12.2f} {r['reference']['median_ms']:13.2f} "
              f"{r['speed_vs_reference']:6.2f}x  {r['reference_name']} "
              f"(spread {r['cudashim']['min_ms']:.1f}-{r['cudashim']['max_ms']:.1f} vs "
              f"{r['reference']['min_ms']:.1f}-{r['reference']['max_ms']:.1f} ms)")
        if "wire_bytes_per_rank" in r:
            w = r["wire_bytes_per_rank"]
            print(f"{'':44s} bytes on the wire per rank: {w['cudashim']:,} vs {w['reference']:,} "
                  f"({w['ratio']:.1f}x fewer)")
    machine = {"python": platform.python_version(), "torch": torch.__version__, "numpy": np.__version__,
               "cpus": os.cpu_count(), "threads": torch.get_num_threads(), "platform": platform.platform()}
    with open(args.json, "w") as f:
        json.dump({"machine": machine, "rows": rows}, f, indent=2)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
