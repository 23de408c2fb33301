"""A CUDA training script as the tutorials write it: a DataLoader with workers and pinned memory,
float16 autocast with a GradScaler (both spellings), a torch.compile'd model, a TorchScript'd
loss, and a checkpoint saved and resumed with map_location. It prints one JSON line."""

import argparse
import json

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--checkpoint", required=True)
parser.add_argument("--scaler", choices=("torch.amp", "torch.cuda.amp"), default="torch.amp")
parser.add_argument("--compile", action="store_true")
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

assert torch.cuda.is_available(), "this script needs a CUDA GPU"
device = torch.device("cuda")
torch.manual_seed(0)

inputs = torch.randn(256, 16)
labels = (inputs[:, :4].sum(dim=1) > 0).long()
loader = DataLoader(TensorDataset(inputs, labels), batch_size=32, shuffle=True, num_workers=2,
                    pin_memory=True, persistent_workers=False,
                    generator=torch.Generator().manual_seed(0))


@torch.jit.script
def smoothed_cross_entropy(logits: torch.Tensor, target: torch.Tensor, smoothing: float = 0.1):
    log_probs = F.log_softmax(logits.float(), dim=-1)
    nll = -log_probs.gather(1, target.unsqueeze(1)).squeeze(1)
    return ((1.0 - smoothing) * nll - smoothing * log_probs.mean(dim=-1)).mean()


model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 2)).cuda()
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
scaler = torch.amp.GradScaler("cuda") if args.scaler == "torch.amp" else torch.cuda.amp.GradScaler()
train_model = torch.compile(model) if args.compile else model

losses = []
for epoch in range(args.epochs):
    for x, y in loader:
        x, y = x.cuda(non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            logits = train_model(x)
        loss = smoothed_cross_entropy(logits, y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        losses.append(loss.item())
torch.cuda.synchronize()

torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict()}, args.checkpoint)
on_host = torch.load(args.checkpoint, map_location="cpu")
resumed = torch.load(args.checkpoint, map_location="cuda:0")
model.load_state_dict(resumed["model"])
optimizer.load_state_dict(resumed["optimizer"])
scaler.load_state_dict(resumed["scaler"])

print(json.dumps({
    "losses": losses,
    "scale": scaler.get_scale(),
    "host_devices": sorted({str(t.device) for t in on_host["model"].values()}),
    "resumed_devices": sorted({str(t.device) for t in resumed["model"].values()}),
    "parameters_on": sorted({str(p.device) for p in model.parameters()}),
    "is_cuda": all(p.is_cuda for p in model.parameters()),
}))
