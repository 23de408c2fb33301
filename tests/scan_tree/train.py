"""Train a small classifier with mixed precision on one GPU."""
import argparse
import os

import torch
import torch.nn as nn
from torch.cuda.amp import GradScaler, autocast  # scan: handled

from data import make_loader
from telemetry import log_gpu_memory


def train(args):
    os.environ["CUDA_VISIBLE_DEVICES"] = args.gpus  # scan: handled
    torch.backends.cudnn.benchmark = True  # scan: handled
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # scan: handled
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).cuda()  # scan: handled
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    scaler = GradScaler()
    for step, (x, y) in enumerate(make_loader(args.batch_size)):
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        if x.device.type == "cuda":  # scan: runs differently
            torch.cuda.synchronize()  # scan: handled
        with autocast():
            loss = nn.functional.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        if step % 100 == 0:
            print(f"step {step} loss {loss.item():.3f}")
            log_gpu_memory(device)
    torch.save(model.state_dict(), "model.pt")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--gpus", default="0")
    train(parser.parse_args())
