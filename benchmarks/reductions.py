"""Long reductions on the CPU backend: how far torch's own kernels and cudashim's (the compiled
sums in double, or torch's kernel over blocks: ``cudashim/patches/reductions.py``) are from
float64, and what they cost.

    python benchmarks/reductions.py [--quick] [--json PATH]

One activated process. Per row and length, the blocked call and torch's own (the original of
the patched function) take turns after a warm-up; the cost is the median of the per-turn
ratios, with their middle half. Errors are relative to the float64 result, on positive values
(every rounding adds up). The short row is a call below the blocking length: what the one
check costs every other norm.
"""

import argparse
import json
import os
import platform
import statistics
import sys
import timeit

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import torch  # noqa: E402

import cudashim  # noqa: E402

TARGET = 1.2          # at most 1.2x torch's cost


def rows():
    """name -> (shimmed call, torch's own call), each taking the float32 input x and y."""
    original = cudashim.get_original
    vector_norm = original(torch.linalg, "vector_norm")
    foreach_norm, dist = original(torch, "_foreach_norm"), original(torch, "dist")
    dot, mv = original(torch, "dot"), original(torch, "mv")
    cosine_similarity = original(torch, "cosine_similarity")
    return {
        "vector_norm (2-norm)": (lambda x, y: torch.linalg.vector_norm(x), lambda x, y: vector_norm(x)),
        "vector_norm (1-norm)": (lambda x, y: torch.linalg.vector_norm(x, 1), lambda x, y: vector_norm(x, 1)),
        "vector_norm over the last dim of (4, n/4)": (
            lambda x, y: torch.linalg.vector_norm(x.view(4, -1), dim=-1),
            lambda x, y: vector_norm(x.view(4, -1), dim=-1)),
        "_foreach_norm (clip_grad_norm_)": (lambda x, y: torch._foreach_norm([x, y]),
                                            lambda x, y: foreach_norm([x, y])),
        "dist": (lambda x, y: torch.dist(x, y), lambda x, y: dist(x, y)),
        "cosine_similarity": (lambda x, y: torch.cosine_similarity(x, y, 0),
                              lambda x, y: cosine_similarity(x, y, 0)),
        "dot": (lambda x, y: torch.dot(x, y), lambda x, y: dot(x, y)),
        "mv, one row": (lambda x, y: torch.mv(x.view(1, -1), y), lambda x, y: mv(x.view(1, -1), y)),
    }


# Every other float32 reduction a program calls, measured under the shim for the survey: those
# torch's CPU kernels already keep near CUDA's accuracy, and those left as they are.
SURVEY = {
    "sum": lambda x, y: x.sum(), "mean": lambda x, y: x.mean(), "nansum": lambda x, y: x.nansum(),
    "var": lambda x, y: x.var(), "std": lambda x, y: x.std(),
    "logsumexp": lambda x, y: torch.logsumexp(x, 0), "cumsum (last)": lambda x, y: x.cumsum(0)[-1:],
    "mse_loss": lambda x, y: torch.nn.functional.mse_loss(x, y),
    "l1_loss": lambda x, y: torch.nn.functional.l1_loss(x, y),
    "softmax (first)": lambda x, y: torch.softmax(x, 0)[:1],
    "cross_entropy over one long row": lambda x, y: torch.nn.functional.cross_entropy(
        x.view(1, -1), torch.zeros(1, dtype=torch.long, device=x.device)),
    "cosine_similarity": lambda x, y: torch.nn.functional.cosine_similarity(x, y, dim=0),
    "x @ y (1-D)": lambda x, y: x @ y, "einsum('i,i->')": lambda x, y: torch.einsum("i,i->", x, y),
    "vector_norm (2-norm)": lambda x, y: torch.linalg.vector_norm(x), "dot": lambda x, y: torch.dot(x, y),
}


def survey(lengths):
    """{name: {length: error against float64}} under the shim."""
    generator = torch.Generator().manual_seed(1)
    found = {name: {} for name in SURVEY}
    for length in lengths:
        x = torch.rand(length, generator=generator).add_(0.5).cuda()
        y = torch.rand(length, generator=generator).add_(0.5).cuda()
        for name, call in SURVEY.items():
            found[name][str(length)] = error(call(x, y), call(x.double(), y.double()))
    for name, errors in found.items():
        print(f"{name:32s} " + "  ".join(f"{e:.1e}" for e in errors.values()), flush=True)
    return found


def error(value, reference):
    value = value[0] if isinstance(value, (tuple, list)) else value
    reference = reference[0] if isinstance(reference, (tuple, list)) else reference
    return ((value.double() - reference.double()).abs().max() / reference.double().abs().max()).item()


def turns(first, second, seconds):
    """Per-turn time ratios first/second, one timed call each a turn."""
    ratios, times = [], {"first": [], "second": []}
    for fn in (first, second):                     # warm-up
        fn()
    deadline = timeit.default_timer() + seconds
    while timeit.default_timer() < deadline or len(ratios) < 5:
        a = timeit.timeit(first, number=1)
        b = timeit.timeit(second, number=1)
        ratios.append(a / b)
        times["first"].append(a)
        times["second"].append(b)
    quartiles = statistics.quantiles(ratios, n=4)
    return (statistics.median(ratios), [quartiles[0], quartiles[2]],
            statistics.median(times["first"]) * 1e3, statistics.median(times["second"]) * 1e3)


def measure(lengths, seconds):
    results = []
    generator = torch.Generator().manual_seed(0)
    for length in lengths:
        x = torch.rand(length, generator=generator).add_(0.5).cuda()
        y = torch.rand(length, generator=generator).add_(0.5).cuda()
        for name, (shimmed, native) in rows().items():
            reference = native(x.double(), y.double())
            ratio, spread, shim_ms, native_ms = turns(lambda: shimmed(x, y), lambda: native(x, y), seconds)
            results.append({"what": name, "length": length, "torch_error": error(native(x, y), reference),
                            "shimmed_error": error(shimmed(x, y), reference), "torch_ms": native_ms,
                            "shimmed_ms": shim_ms, "ratio": ratio, "ratio_middle_half": spread,
                            "met": spread[1] <= TARGET})
            print(f"{name:42s} 2**{length.bit_length() - 1:<3d} error {results[-1]['torch_error']:.1e} -> "
                  f"{results[-1]['shimmed_error']:.1e}   {native_ms:8.3f} -> {shim_ms:8.3f} ms  "
                  f"{ratio:.2f}x ({spread[0]:.2f}-{spread[1]:.2f})", flush=True)
    return results


def short_call(seconds):
    """A norm below the blocking length: the one check every other call pays, in ns."""
    x = torch.rand(1000).cuda()
    native = cudashim.get_original(torch.linalg, "vector_norm")
    differences = []
    deadline = timeit.default_timer() + seconds
    while timeit.default_timer() < deadline or len(differences) < 5:
        shimmed_ns = timeit.timeit(lambda: torch.linalg.vector_norm(x), number=2000) / 2000 * 1e9
        native_ns = timeit.timeit(lambda: native(x), number=2000) / 2000 * 1e9
        differences.append((shimmed_ns, native_ns))
    extras = [s - n for s, n in differences]
    quartiles = statistics.quantiles(extras, n=4)
    return {"what": "vector_norm of 1000 values (not blocked)", "native_ns": statistics.median(n for _, n in differences),
            "extra_ns": statistics.median(extras), "extra_middle_half_ns": [quartiles[0], quartiles[2]]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=os.path.join(ROOT, "benchmarks", "results", "reductions.json"))
    parser.add_argument("--quick", action="store_true", help="two lengths, short turns: a smoke run")
    args = parser.parse_args()
    cudashim.activate("cpu")
    lengths = [2 ** 22 + 36, 2 ** 24 + 36] if args.quick else [2 ** 18 + 36, 2 ** 20 + 36, 2 ** 22 + 36,
                                                               2 ** 24 + 36, 2 ** 26 + 36]
    seconds = 0.5 if args.quick else 3.0
    result = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
              "torch": torch.__version__, "threads": torch.get_num_threads(), "target": TARGET,
              "rows": measure(lengths, seconds), "short": short_call(seconds),
              "survey": survey([2 ** 20 + 36, 2 ** 24 + 36] + ([] if args.quick else [2 ** 26 + 36]))}
    short = result["short"]
    print(f"{short['what']}: {short['native_ns']:.0f} ns, {short['extra_ns']:+.0f} ns")
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
