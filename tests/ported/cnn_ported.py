"""examples/cnn.py ported by hand to the device named by --device (the CPU by default):
the reference for the shimmed run."""

import argparse
import json
import os
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--losses", help="write the training losses here as JSON")
parser.add_argument("--device", default="cpu")
parser.add_argument("--vendor", help="the vendor extension to import first (torch_npu, ...)")
args = parser.parse_args()
if args.vendor:
    __import__(args.vendor)
device = args.device

torch.manual_seed(0)

# Synthetic 3x16x16 images whose class is the colour channel that is brightest overall.
images = torch.randn(768, 3, 16, 16)
labels = images.mean(dim=(2, 3)).argmax(dim=1)
loader = DataLoader(TensorDataset(images, labels), batch_size=64, shuffle=True,
                    drop_last=True)

model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(32, 3),
).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
criterion = nn.CrossEntropyLoss()

losses = []
for epoch in range(args.epochs):
    correct = 0
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        correct += (out.argmax(1) == y).sum().item()
    print(f"epoch {epoch} | loss {losses[-1]:.4f} | accuracy {correct / (len(loader) * 64):.3f}")
if args.losses:
    with open(args.losses, "w") as f:
        json.dump(losses, f)

if device != "cpu":
    # torch's autograd engine runs a device's backward on a thread of its own, which lets go of
    # the backward's state only after it wakes the caller. A native program that ends right
    # after its last backward, as this one does, can reach interpreter finalisation first on a
    # busy machine and abort: "terminate called without an active exception", SIGABRT (CI's run
    # on the fake musa device). cudashim drains that thread for the programs it runs
    # (cudashim/autograd_exit.py); this reference, run without it, ends without finalisation
    # once its results are written.
    sys.stdout.flush()
    os._exit(0)
