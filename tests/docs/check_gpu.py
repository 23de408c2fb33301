"""A script with CUDA assumptions no shim can reach, for the README's `cudashim scan` example."""

import subprocess

import torch
from torch.cuda.amp import GradScaler, autocast

device = torch.device("cuda")
x = torch.randn(4, device=device)

if x.device.type == "cuda":
    print("on the GPU")

scaler = GradScaler()
with autocast():
    y = x * 2
print(subprocess.run(["nvidia-smi"], capture_output=True).stdout)
