"""Triton kernels written for CUDA, timed under cudashim against torch's own ops: the program
``benchmarks/triton_kernels.py`` runs (in a Python whose torch brings triton).

python -m cudashim benchmarks/programs/triton_timing.py OUT.json [--repeats N]

Each row launches one kernel of the tutorials' program (``tests/programs/triton_tutorials.py``)
or of Liger, which run through Triton's interpreter where the target has no Triton backend, and
the torch op that computes the same, taking turns; medians in milliseconds.
"""

import argparse
import json
import os
import statistics
import sys

import torch
import triton
import triton.language as tl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "tests", "programs"))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import triton_tutorials as kernels  # noqa: E402
from measure import timed  # noqa: E402


@triton.jit
def _store_keys(key_ptr, cache_ptr, slot_ptr, D: tl.constexpr):
    """An inference engine's key store: one program per token writes its row at its slot."""
    token = tl.program_id(0)
    offsets = tl.arange(0, D)
    tl.store(cache_ptr + tl.load(slot_ptr + token) * D + offsets, tl.load(key_ptr + token * D + offsets))


def rows():
    # Launched on one layer's view of a cache allocated for all layers, as engines do: the work
    # is 4 rows, whatever the cache's size.
    cache = torch.zeros(2, 8, 4096, 2048, device="cuda", dtype=torch.float16)      # 256 MiB
    layer, keys = cache[0, 3].view(-1, 128), torch.randn(4, 128, device="cuda", dtype=torch.float16)
    slots = torch.tensor([5, 900, 17000, 65000], device="cuda")
    yield ("key store, 4 rows of 128 float16 into one layer of a 256 MiB cache",
           lambda: _store_keys[(4,)](keys, layer, slots, 128), lambda: layer.index_copy_(0, slots, keys))
    x, y = torch.rand(2**16, device="cuda"), torch.rand(2**16, device="cuda")
    yield "elementwise (a*x + y), 65536 float32", lambda: kernels.axpy(0.5, x, y), lambda: 0.5 * x + y
    rows_ = torch.randn(256, 512, device="cuda")
    yield "row softmax, 256 x 512 float32", lambda: kernels.row_softmax(rows_), lambda: torch.softmax(rows_, 1)
    weight, bias = torch.rand(512, device="cuda"), torch.rand(512, device="cuda")
    yield ("layer norm forward, 256 x 512 float32", lambda: kernels.TritonLayerNorm.apply(rows_, weight, bias, 1e-5),
           lambda: torch.nn.functional.layer_norm(rows_, (512, ), weight, bias, 1e-5))
    a = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    b = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    yield "matmul, 256 x 256 x 256 float16", lambda: kernels.matmul(a, b), lambda: a @ b
    try:
        from liger_kernel.transformers.rms_norm import LigerRMSNorm
    except ImportError:
        return
    norm = LigerRMSNorm(512).cuda()
    hidden = torch.randn(8, 128, 512, device="cuda")

    def rms_norm():
        return norm.weight * hidden * torch.rsqrt(hidden.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)

    with torch.no_grad():
        yield "Liger's RMSNorm forward, 8 x 128 x 512 float32", lambda: norm(hidden), rms_norm


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.manual_seed(0)
    results = []
    for what, kernel, reference in rows():
        samples = timed({"kernel": kernel, "torch": reference}, args.repeats, warm_up=1)
        kernel_ms, torch_ms = statistics.median(samples["kernel"]), statistics.median(samples["torch"])
        results.append({"what": what, "interpreted_ms": kernel_ms, "torch_ms": torch_ms,
                        "ratio": kernel_ms / torch_ms})
        print(f"{what}: {kernel_ms:.2f} ms against {torch_ms:.3f} ms ({kernel_ms / torch_ms:.0f}x)", flush=True)
    import triton
    with open(args.out, "w") as out:
        json.dump({"rows": results, "triton": triton.__version__, "torch": torch.__version__}, out)


if __name__ == "__main__":
    main()
