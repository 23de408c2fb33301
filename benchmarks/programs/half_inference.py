"""Batch inference as CUDA scripts write it: a model made ``.cuda().half()``, run under
``no_grad`` on float16 batches. Two models, each the common shape of its kind:

- ``attention``: a stack of encoder layers (``nn.TransformerEncoderLayer``, which runs
  ``nn.MultiheadAttention``) in eval mode, whose forward torch computes through its fused
  inference path, with a padded batch (``src_key_padding_mask``);
- ``convnet``: a ResNet-like stack of 3x3 convolutions, batch norm, ReLU and pooling, with a
  linear classifier.

    python -m cudashim benchmarks/programs/half_inference.py --model attention --times OUT.json
    python benchmarks/programs/half_inference.py --model convnet --device cpu --dtype float32 --times OUT.json

The time of each batch after a warm-up one, and the outputs' argmax, go to ``--times``.
"""

import argparse

import torch
import torch.nn as nn
from generations import time_generations

parser = argparse.ArgumentParser()
parser.add_argument("--model", choices=("attention", "convnet"), required=True)
parser.add_argument("--device", default="cuda")
parser.add_argument("--dtype", default="float16")
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("--times", required=True)
args = parser.parse_args()


def attention_model():
    layer = nn.TransformerEncoderLayer(512, 8, 2048, batch_first=True, activation="gelu")
    return nn.TransformerEncoder(layer, 4, enable_nested_tensor=True)


def convnet():
    def stage(width_in, width_out):
        return nn.Sequential(nn.Conv2d(width_in, width_out, 3, 2, 1, bias=False), nn.BatchNorm2d(width_out),
                             nn.ReLU(inplace=True), nn.Conv2d(width_out, width_out, 3, 1, 1, bias=False),
                             nn.BatchNorm2d(width_out), nn.ReLU(inplace=True))
    return nn.Sequential(nn.Conv2d(3, 32, 3, 1, 1, bias=False), nn.BatchNorm2d(32), nn.ReLU(inplace=True),
                         stage(32, 64), stage(64, 128), nn.MaxPool2d(2), stage(128, 256),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(256, 100))


torch.manual_seed(0)
dtype = getattr(torch, args.dtype)
if args.model == "attention":
    model = attention_model()
    batch = torch.randn(4, 128, 512)
    padding = torch.zeros(4, 128, dtype=torch.bool, device=args.device)
    padding[2:, 96:] = True                           # two shorter sequences, padded

    def infer(x):
        return model(x, src_key_padding_mask=padding).float().sum(-1)
else:
    model = convnet()
    batch = torch.randn(16, 3, 64, 64)

    def infer(x):
        return model(x)
model = model.to(args.device).to(dtype).eval()
batch = batch.to(args.device).to(dtype)


@torch.no_grad()
def run(x):
    return infer(x).argmax(-1)


time_generations(run, batch, args.repeats, args.device, args.times)
