"""GPU telemetry for the training log."""
import subprocess

import torch as th


def log_gpu_memory(device):
    if "cuda" in str(device):  # scan: runs differently
        used = th.cuda.memory_allocated(device) / 2**20  # scan: handled
        print(f"allocated {used:.0f} MiB")
    smi = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv"],  # scan: needs a change
                         capture_output=True, text=True)
    print(smi.stdout)


def device_label(tensor):
    dev = tensor.device
    name = str(dev)
    if name.startswith("cuda"):  # scan: runs differently
        return name.split(":")[1]
    kind = dev.type
    return "gpu" if kind == "cuda" else "cpu"  # scan: runs differently


def transfer_mode(batch):
    match batch.device.type:
        case "cuda":  # scan: runs differently
            return "pinned"
        case _:
            return "pageable"
