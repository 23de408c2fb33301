"""Train a small CNN classifier on synthetic images. Written for an NVIDIA GPU.

    python -m cudashim examples/cnn.py
"""

import argparse
import json
import time

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--losses", help="write the training losses here as JSON")
parser.add_argument("--step-times", help="write each step's wall time in seconds here as JSON")
args = parser.parse_args()

torch.backends.cudnn.benchmark = True
torch.manual_seed(0)

# Synthetic 3x16x16 images whose class is the colour channel that is brightest overall.
images = torch.randn(768, 3, 16, 16)
labels = images.mean(dim=(2, 3)).argmax(dim=1)
loader = DataLoader(TensorDataset(images, labels), batch_size=64, shuffle=True,
                    pin_memory=True, drop_last=True)

model = nn.Sequential(
    nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
    nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.AdaptiveAvgPool2d(1),
    nn.Flatten(), nn.Linear(32, 3),
).to(0)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
criterion = nn.CrossEntropyLoss().cuda()

losses, step_times = [], []
for epoch in range(args.epochs):
    correct = 0
    for x, y in loader:
        began = time.perf_counter()
        x, y = x.to(0, non_blocking=True), y.cuda(non_blocking=True)
        optimizer.zero_grad()
        out = model(x)
        loss = criterion(out, y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        correct += (out.argmax(1) == y).sum().item()
        step_times.append(time.perf_counter() - began)
    torch.cuda.synchronize()
    print(f"epoch {epoch} | loss {losses[-1]:.4f} | accuracy {correct / (len(loader) * 64):.3f}")
if args.losses:
    with open(args.losses, "w") as f:
        json.dump(losses, f)
if args.step_times:
    with open(args.step_times, "w") as f:
        json.dump(step_times, f)
