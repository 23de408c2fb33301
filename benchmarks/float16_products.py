"""Every product of matrices a float16 program can call, under the shim's precision policy,
against the best a hand port gets from this CPU and against torch's own float16 kernel.

    python benchmarks/float16_products.py [--quick] [--json PATH]

One activated process on the CPU backend. Each row is one call at a training layer's size
(256 rows a matrix, widths of 512: the compute-bound class, where the policy computes float16
in its compute-bound choice), timed five ways: the shimmed float16 call; the same call in
float32 and in bfloat16, the ports a user could write; float16 inputs converted to float32 by
hand where the call reads them and the result rounded back (the floor for operands the policy
does not keep, which inference's parameters are); and torch's own function on the float16
inputs (what the call cost before the policy covered it). The fast sides take turns call by
call (``measure.timed``). Target: the shimmed call within 10% of the faster port, read off the
per-turn ratios' median and middle half (``measure.speed``).
"""

import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)
sys.path.insert(0, HERE)

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import cudashim  # noqa: E402
from measure import speed, summary, timed, verdict  # noqa: E402

TARGET = 1.10                  # at most 1.1x the faster port's time
ROWS, WIDTH, BATCH = 256, 512, 8


def inputs(dtype):
    generator = torch.Generator().manual_seed(0)

    def rand(*shape):
        return torch.randn(*shape, generator=generator).to(dtype)
    return {"x": rand(ROWS, WIDTH), "w": rand(WIDTH, WIDTH), "b": rand(BATCH, ROWS // 4, WIDTH),
            "pair": rand(ROWS, WIDTH // 8), "form": rand(WIDTH // 8, WIDTH // 8, WIDTH // 8)}


def calls(functions):
    """name -> call on one dtype's inputs, through ``functions`` (the patched module objects,
    or torch's own functions fetched before activation)."""
    f = functions
    return {
        "torch.linalg.matmul": lambda t: f["linalg.matmul"](t["x"], t["w"]),
        "torch.linalg.multi_dot (3 matrices)": lambda t: f["linalg.multi_dot"]([t["x"], t["w"], t["w"]]),
        "torch.tensordot": lambda t: f["tensordot"](t["b"], t["w"], dims=([2], [0])),
        "torch.inner": lambda t: f["inner"](t["x"], t["w"]),
        "torch.addbmm": lambda t: f["addbmm"](t["x"][:64, :64], t["b"], t["b"].transpose(1, 2)),
        "Tensor.addmm_": lambda t: f["addmm_"](t["x"].clone(), t["x"], t["w"]),
        "Tensor.baddbmm_": lambda t: f["baddbmm_"](t["b"][:, :, :64].clone(), t["b"], t["b"].transpose(1, 2)[:, :, :64]),
        "torch.mm(out=)": lambda t: f["mm"](t["x"], t["w"], out=t["x"].new_empty(ROWS, WIDTH)),
        "F.bilinear (nn.Bilinear)": lambda t: f["bilinear"](t["pair"], t["pair"], t["form"]),
        "torch.cdist": lambda t: f["cdist"](t["x"], t["w"]),
    }


def functions():
    return {"linalg.matmul": torch.linalg.matmul, "linalg.multi_dot": torch.linalg.multi_dot,
            "tensordot": torch.tensordot, "inner": torch.inner, "addbmm": torch.addbmm,
            "addmm_": torch.Tensor.addmm_, "baddbmm_": torch.Tensor.baddbmm_, "mm": torch.mm,
            "bilinear": F.bilinear, "cdist": torch.cdist}


class Widened(dict):
    """A dtype's inputs, each converted to float32 where the call reads it: the conversions a
    float16 call computed in float32 cannot avoid for operands it does not keep."""
    def __getitem__(self, key):
        return super().__getitem__(key).float()


def measure(repeats):
    own = calls(functions())                        # torch's own, fetched before activation
    cudashim.activate("cpu")
    shimmed = calls(functions())
    fast_bfloat16 = cudashim.activation.current_activation().precision.fast.get(torch.bfloat16, False)
    half, single, brain = (inputs(dtype) for dtype in (torch.float16, torch.float32, torch.bfloat16))
    rows = []
    for name in shimmed:
        # Sides that take turns call by call. A side far slower than the others (torch's float16
        # kernels, and bfloat16 where the host has no fast path) leaves the call after it slow
        # (0.97 -> 2.2 ms here): it is timed on its own.
        paired = {"shimmed": lambda: shimmed[name](half), "float32": lambda: own[name](single),
                  "converted": lambda: own[name](Widened(half)).half()}
        alone = {"as_asked": lambda: own[name](half)}
        (paired if fast_bfloat16 else alone)["bfloat16"] = lambda: own[name](brain)
        samples = timed(paired, repeats)
        samples.update({side: timed({side: call}, max(3, repeats // 5))[side] for side, call in alone.items()})
        medians = {side: summary(values)["median_ms"] for side, values in samples.items()}
        best = min(("float32", "bfloat16"), key=medians.get)
        faster = speed(samples[best], samples["shimmed"]) if best in paired else \
            speed([medians[best]] * repeats, samples["shimmed"])          # unpaired: a host's noise
        floor = speed(samples["converted"], samples["shimmed"])
        row = {"what": name, **{f"{side}_ms": value for side, value in medians.items()},
               "best_port": best, "ratio": 1 / faster["median"],
               "ratio_middle_half": [1 / faster["high"], 1 / faster["low"]],
               "against_converted": 1 / floor["median"], "met": verdict(faster, 1 / TARGET)}
        rows.append(row)
        print(f"{name:36s} shimmed {medians['shimmed']:7.3f} ms  float32 {medians['float32']:7.3f}  "
              f"converted by hand {medians['converted']:7.3f}  bfloat16 {medians['bfloat16']:8.3f}  "
              f"torch's float16 {medians['as_asked']:8.3f}  {row['ratio']:.2f}x {best} "
              f"({row['ratio_middle_half'][0]:.2f}-{row['ratio_middle_half'][1]:.2f}): {row['met']}; "
              f"{row['against_converted']:.2f}x converted", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", default=os.path.join(HERE, "results", "float16_products.json"))
    parser.add_argument("--quick", action="store_true", help="a few turns: a smoke run")
    args = parser.parse_args()
    rows = measure(repeats=3 if args.quick else 15)
    policy = cudashim.activation.current_activation().precision
    result = {"torch": torch.__version__, "threads": torch.get_num_threads(), "target": TARGET,
              "compute_bound_choice": policy.float16_matmuls.compute_bound, "rows": rows}
    with open(args.json, "w") as f:
        json.dump(result, f, indent=1)
    print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
