"""A decoding step's key store as a Triton kernel, captured in a CUDA graph and replayed.

Small inference engines write each new token's keys into a paged cache with a Triton kernel of
one program per token, a slot of -1 skipped, inside the decoding step they capture once and
replay per token. Here the step stores three tokens' keys and reads the cache after; each replay
gets new keys and new slots. Writes JSON (argv[1]): whether the capture left the cache as it
found it (CUDA's capture runs nothing), and whether each replay wrote what an eager store writes.
"""

import json
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


torch.manual_seed(0)
width, tokens = 16, 3
cache = torch.zeros(10, width, device="cuda")
keys = torch.randn(tokens, width, device="cuda")
slots = torch.tensor([1, -1, 4], device="cuda")
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    store(keys, cache, slots)
    doubled = cache * 2                       # captured work after the kernel reads what it wrote
untouched = bool((cache == 0).all())

replays = []
for step in range(3):
    keys.copy_(torch.randn(tokens, width))
    slots.copy_(torch.tensor([step, -1, 5 + step]))
    expected = stored_by_hand(keys, cache, slots)
    graph.replay()
    replays.append(bool(torch.equal(cache, expected)) and bool(torch.equal(doubled, expected * 2)))

with open(sys.argv[1], "w") as out:
    json.dump({"untouched_by_capture": untouched, "replays": replays, "device": str(cache.device)}, out)
