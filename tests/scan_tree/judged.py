"""Code whose verdict depends on what it does: prose is never code, a device-name test is
judged by the branch the target takes, device indices by the devices the run has."""
import argparse
import shutil
import subprocess
import sys

import torch
import torch.nn as nn


def options():
    parser = argparse.ArgumentParser(description="trains on cuda:0 with nccl")
    parser.add_argument("--sync", action="store_true",
                        help="call torch.cuda.synchronize() after each step (see nvidia-smi)")
    return parser


def report(model):
    print("torch.cuda.is_available():", torch.cuda.is_available())  # scan: handled
    try:
        subprocess.run(["nvidia-smi"], check=True)  # scan: runs differently
    except FileNotFoundError as e:
        print("nvidia-smi missing:", e)
    print(f"cuda:0 has {torch.cuda.device_count()} peers")  # scan: handled
    if shutil.which("nvcc") is None:  # scan: runs differently
        print("install the CUDA toolkit from /usr/local/cuda")


def needs_cuda(x):
    if x.device.type != "cuda":  # scan: needs a change
        raise RuntimeError("this kernel needs a cuda:0 device")
    assert x.device.type == "cuda", "cuda only"  # scan: needs a change
    if x.device.type == "cpu" or str(x.device) != "cuda:0":  # scan: needs a change
        sys.exit("run on cuda:0")


def loader_options(device):
    pin = device.type == "cuda"  # scan: runs differently
    return {"pin_memory": pin, "num_workers": 2}


def replicate(model):
    model = nn.DataParallel(model, device_ids=[0, 1])  # scan: needs a change
    return nn.parallel.data_parallel(model, torch.ones(2, 2), device_ids=[0])  # scan: handled


def half_step(model, x):
    with torch.autocast("cuda", dtype=torch.float16):  # scan: handled
        out = model(x)
    if out.dtype == torch.float16:  # scan: runs differently
        out = out.float()
    return torch.abs(out)  # scan: handled


def devices():
    count = torch._C._cuda_getDeviceCount()  # scan: needs a change
    if hasattr(torch._C, "_cuda_getDeviceCount"):
        count = torch._C._cuda_getDeviceCount()  # scan: runs differently
    return count


try:
    from mamba_ssm import Mamba  # scan: runs differently
except ImportError:
    Mamba = None


def fused_ops():
    from torch.utils.cpp_extension import load
    try:
        return load(name="fused", sources=["fused.cpp", "fused_kernel.cu"])  # scan: runs differently
    except RuntimeError:
        return None
