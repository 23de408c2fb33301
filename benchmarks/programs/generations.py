"""What the generation programs share: time each generation after a warm-up one, and write the
times and the last tokens as JSON."""

import json
import time

import torch


def time_generations(generate, prompt, repeats, device, path):
    generate(prompt)                                     # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = generate(prompt)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    with open(path, "w") as out:
        json.dump({"times": times, "tokens": tokens.tolist()}, out)
