"""A CUDA script whose last line is a backward: the saliency map of a model's inputs, as
interpretability scripts compute it.

On a busy machine such a script can reach its end before the device's autograd thread has let
go of that backward, which then frees Python objects while the interpreter ends. This program
makes the machine busy for that thread: it runs on one CPU, and its main thread keeps the GIL
until it blocks. ``--default-device`` makes the device the default first
(``torch.set_default_device("cuda")``, as LLM scripts do), which puts a torch function mode into
every backward's state.

Run under ``python -m cudashim``; success is a clean exit (status 0) after the line it prints.
"""

import os
import sys

import torch
import torch.nn as nn

os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})    # threads started later inherit it
sys.setswitchinterval(1000)

if "--default-device" in sys.argv:
    torch.set_default_device("cuda")
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).cuda().eval()
images = torch.randn(8, 16).cuda().requires_grad_()
print("saliency of", tuple(images.shape), flush=True)
model(images).sum().backward()
