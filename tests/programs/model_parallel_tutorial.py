"""In the style of PyTorch's single-machine model parallel tutorial.

A toy model with its halves on cuda:0 and cuda:1, then a deeper one split the same way and
trained with pipelined micro-batches, each against the same model on one device. Writes the
losses of every variant and where the parts live to argv[1].
"""

import json
import sys

import torch
import torch.nn as nn
import torch.optim as optim


class ToyModel(nn.Module):
    def __init__(self):
        super().__init__()
        self.net1 = torch.nn.Linear(10, 10).to("cuda:0")
        self.relu = torch.nn.ReLU()
        self.net2 = torch.nn.Linear(10, 5).to("cuda:1")

    def forward(self, x):
        x = self.relu(self.net1(x.to("cuda:0")))
        return self.net2(x.to("cuda:1"))


def layers():
    torch.manual_seed(1)
    return [nn.Linear(12, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 16),
            nn.ReLU(), nn.Linear(16, 4)]


class SingleDevice(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(*layers()).to("cuda:0")

    def forward(self, x):
        return self.seq(x.to("cuda:0"))


class ModelParallel(nn.Module):
    def __init__(self):
        super().__init__()
        parts = layers()
        self.seq1 = nn.Sequential(*parts[:4]).to("cuda:0")
        self.seq2 = nn.Sequential(*parts[4:]).to("cuda:1")

    def forward(self, x):
        return self.seq2(self.seq1(x.to("cuda:0")).to("cuda:1"))


class PipelineParallel(ModelParallel):
    def __init__(self, split_size=5):
        super().__init__()
        self.split_size = split_size

    def forward(self, x):
        splits = iter(x.split(self.split_size, dim=0))
        s_next = next(splits)
        s_prev = self.seq1(s_next.to("cuda:0")).to("cuda:1")
        ret = []
        for s_next in splits:
            ret.append(self.seq2(s_prev))               # runs on cuda:1
            s_prev = self.seq1(s_next.to("cuda:0")).to("cuda:1")   # meanwhile on cuda:0
        ret.append(self.seq2(s_prev))
        return torch.cat(ret)


def train(model, steps=4):
    torch.manual_seed(2)
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        inputs, labels = torch.randn(20, 12), torch.randn(20, 4)
        outputs = model(inputs)
        labels = labels.to(outputs.device)
        loss = loss_fn(outputs, labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


toy = ToyModel()
optimizer = optim.SGD(toy.parameters(), lr=0.001)
optimizer.zero_grad()
outputs = toy(torch.randn(20, 10))
labels = torch.randn(20, 5).to("cuda:1")
nn.MSELoss()(outputs, labels).backward()
optimizer.step()

json.dump({
    "toy_output_on": str(outputs.device),
    "parts_on": [str(ModelParallel().seq1[0].weight.device), str(ModelParallel().seq2[0].weight.device)],
    "single": train(SingleDevice()),
    "model_parallel": train(ModelParallel()),
    "pipeline": train(PipelineParallel()),
}, open(sys.argv[1], "w"))
