"""A decoding step's key store as a Triton kernel, captured in a CUDA graph and replayed.

Small inference engines write each new token's keys into a paged cache with a Triton kernel of
one program per token, a slot of -1 skipped, inside the decoding step they capture once and
replay per token. Such an engine allocates one cache for all its layers and launches on a view
of it: here one layer's 64 MiB of a 256 MiB cache, beside a small one. An eager store into the
layer comes first; then the step stores three tokens' keys into each cache and reads the small
one after, and each replay gets new keys and new slots. Writes JSON (argv[1]): whether the eager
store wrote its rows and nothing else; whether the capture left both caches as it found them
(CUDA's capture runs nothing); whether each replay wrote what an eager store writes; and how much
the process's peak resident memory grew at the eager store, as a fraction of the whole cache,
and at the store into it inside the capture, as a fraction of the layer (CUDA's kernel writes the rows in place, and
its capture copies nothing).
"""

import json
import resource
import sys

import torch
import triton
import triton.language as tl


@triton.jit
def store_kernel(key_ptr, key_stride, cache_ptr, slot_ptr, D: tl.constexpr):
    token = tl.program_id(0)
    slot = tl.load(slot_ptr + token)
    if slot == -1:
        return
    offsets = tl.arange(0, D)
    tl.store(cache_ptr + slot * D + offsets, tl.load(key_ptr + token * key_stride + offsets))


def store(keys, cache, slots):
    store_kernel[(keys.shape[0],)](keys, keys.stride(0), cache, slots, keys.shape[1])


def stored_by_hand(keys, cache, slots):
    expected = cache.clone()
    for token, slot in enumerate(slots.tolist()):
        if slot != -1:
            expected[slot] = keys[token]
    return expected


def peak_resident_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # kibibytes on Linux


def nbytes(tensor) -> int:
    return tensor.numel() * tensor.element_size()


torch.manual_seed(0)
large = torch.zeros(2, 2, 8192, 4096, dtype=torch.float16, device="cuda")   # keys and values of 2 layers
layer = large[0, 1].view(-1, 64)                                            # one layer's keys: 64 MiB
large_keys = torch.randn(3, 64, dtype=torch.float16, device="cuda")
large_slots = torch.tensor([7, -1, 500000], device="cuda")
expected_layer = stored_by_hand(large_keys, layer, large_slots)
before = peak_resident_bytes()
store(large_keys, layer, large_slots)
eager_peak_growth = (peak_resident_bytes() - before) / nbytes(large)
large_stored = bool(torch.equal(layer, expected_layer)) and int(large.count_nonzero()) == 2 * 64

width, tokens = 16, 3
cache = torch.zeros(10, width, device="cuda")
keys = torch.randn(tokens, width, device="cuda")
slots = torch.tensor([1, -1, 4], device="cuda")
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    store(keys, cache, slots)
    before = peak_resident_bytes()
    store(large_keys, layer, large_slots)
    capture_peak_growth = (peak_resident_bytes() - before) / nbytes(layer)
    doubled = cache * 2                       # captured work after the kernel reads what it wrote
untouched = bool((cache == 0).all()) and bool(torch.equal(layer, expected_layer))
del expected_layer

replays = []
for step in range(3):
    keys.copy_(torch.randn(tokens, width))
    slots.copy_(torch.tensor([step, -1, 5 + step]))
    large_keys.copy_(torch.randn(3, 64))
    large_slots.copy_(torch.tensor([3 * step, -1, 400000 + step]))
    expected = stored_by_hand(keys, cache, slots)
    expected_layer = stored_by_hand(large_keys, layer, large_slots)
    graph.replay()
    replays.append(bool(torch.equal(cache, expected)) and bool(torch.equal(doubled, expected * 2))
                   and bool(torch.equal(layer, expected_layer)))
    del expected_layer

with open(sys.argv[1], "w") as out:
    json.dump({"untouched_by_capture": untouched, "replays": replays, "device": str(cache.device),
               "large_stored": large_stored, "eager_peak_growth": eager_peak_growth,
               "capture_peak_growth": capture_peak_growth}, out)
