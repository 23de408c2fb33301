"""Pin each rank to the CPUs near its GPU, as NVIDIA's training examples do (gpu_affinity.py):
NVML's CPU affinity bitmask, read word by word, then the process's own affinity set to it.
Prints what NVML said and where the process ended up, as JSON."""

import json
import math
import os

import torch
import pynvml


def device_cpus(index):
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    words = math.ceil(os.cpu_count() / 64)
    bits = ""
    for word in pynvml.nvmlDeviceGetCpuAffinity(handle, words):
        bits = "{:064b}".format(word) + bits
    return [cpu for cpu, bit in enumerate(reversed(bits)) if bit == "1"]


def main():
    pynvml.nvmlInit()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cpus = device_cpus(local_rank)
    os.sched_setaffinity(0, cpus)
    handle = pynvml.nvmlDeviceGetHandleByIndex(local_rank)
    try:
        power = pynvml.nvmlDeviceGetPowerUsage(handle)
    except pynvml.NVMLError_NotSupported:
        power = None
    cuda_driver = pynvml.nvmlSystemGetCudaDriverVersion()
    assert cuda_driver // 1000 >= int(torch.version.cuda.split(".")[0]), "driver too old for this CUDA"
    print(json.dumps({
        "stand_in": "cudashim" in pynvml.__file__,
        "torch_cuda_holds_it": getattr(torch.cuda, "pynvml", pynvml) is pynvml,
        "devices": pynvml.nvmlDeviceGetCount(),
        "cpus": cpus,
        "pinned": sorted(os.sched_getaffinity(0)),
        "numa_node": pynvml.nvmlDeviceGetNumaNodeId(handle),
        "power": power,
        "driver": pynvml.nvmlSystemGetDriverVersion(),
        "cuda_driver": cuda_driver,
    }))
    pynvml.nvmlShutdown()


if __name__ == "__main__":
    main()
