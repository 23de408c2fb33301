"""An image classifier trained as NVIDIA's ConvNets recipe trains one, written for CUDA.

python convnet_recipe.py OUT.json [--steps N] [--script] [--no-amp]

What the recipe's ``main.py`` does, at toy size: uint8 images collated by hand into pinned
batches, a prefetcher that moves and normalizes the next batch on a side CUDA stream while the
current one trains, an SE-ResNet in channels-last memory format, float16 autocast with a dynamic
GradScaler, label smoothing, SGD with Nesterov momentum and a cosine learning rate, and
``cudnn.benchmark``. ``--script`` then trains the same model from the same weights through
TorchScript under autocast, as the recipe's EfficientNet runs with ``--jit script``. Writes
the losses, the dtype the last step computed in and where the weights ended up as JSON.
"""

import argparse
import json
import math

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset

CLASSES, SIZE, BATCH = 10, 16, 16


class Images(Dataset):
    """uint8 HWC images, as PIL decodes them, with a label each."""

    def __init__(self, count):
        generator = np.random.default_rng(0)
        self.labels = generator.integers(0, CLASSES, count)
        base = generator.integers(0, 256, (CLASSES, SIZE, SIZE, 3))
        noise = generator.integers(-40, 40, (count, SIZE, SIZE, 3))
        self.images = np.clip(base[self.labels] + noise, 0, 255).astype(np.uint8)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return self.images[index], int(self.labels[index])


def fast_collate(batch, memory_format):
    """The recipe's collate: uint8 NCHW, normalized later on the device."""
    images = [image for image, _ in batch]
    targets = torch.tensor([target for _, target in batch], dtype=torch.int64)
    tensor = torch.zeros((len(images), 3, SIZE, SIZE), dtype=torch.uint8).contiguous(memory_format=memory_format)
    for i, image in enumerate(images):
        tensor[i] += torch.from_numpy(np.ascontiguousarray(image.transpose(2, 0, 1)))
    return tensor, targets


def prefetched(loader, memory_format):
    """Move and normalize the next batch on a side stream while the current one trains."""
    mean = torch.tensor([0.485 * 255, 0.456 * 255, 0.406 * 255]).cuda().view(1, 3, 1, 1)
    std = torch.tensor([0.229 * 255, 0.224 * 255, 0.225 * 255]).cuda().view(1, 3, 1, 1)
    stream = torch.cuda.Stream()
    first = True
    for next_input, next_target in loader:
        with torch.cuda.stream(stream):
            next_input = next_input.cuda(non_blocking=True)
            next_target = next_target.cuda(non_blocking=True)
            next_input = next_input.float().sub_(mean).div_(std).contiguous(memory_format=memory_format)
        if not first:
            yield input, target
        else:
            first = False
        torch.cuda.current_stream().wait_stream(stream)
        input, target = next_input, next_target
        input.record_stream(torch.cuda.current_stream())
        target.record_stream(torch.cuda.current_stream())
    yield input, target


class SqueezeExcitation(nn.Module):
    """Channel attention as the recipe's SE-ResNeXt and EfficientNet compute it."""

    def __init__(self, channels, squeezed):
        super().__init__()
        self.squeeze = nn.Linear(channels, squeezed)
        self.expand = nn.Linear(squeezed, channels)

    def forward(self, x):
        weights = self.expand(F.silu(self.squeeze(x.mean(dim=(2, 3)))))
        return x * torch.sigmoid(weights).unsqueeze(2).unsqueeze(3)


class BasicBlock(nn.Module):
    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.se = SqueezeExcitation(planes, planes // 4)
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                                            nn.BatchNorm2d(planes))

    def forward(self, x):
        residual = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.se(self.bn2(self.conv2(out)))
        return F.relu(out + residual)


class ResNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(16)
        self.layer1 = BasicBlock(16, 16)
        self.layer2 = BasicBlock(16, 32, stride=2)
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, x):
        x = F.relu(self.bn1(self.conv1(x)))
        x = self.layer2(self.layer1(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class LabelSmoothing(nn.Module):
    def __init__(self, smoothing=0.1):
        super().__init__()
        self.confidence, self.smoothing = 1.0 - smoothing, smoothing

    def forward(self, x, target):
        logprobs = F.log_softmax(x, dim=-1)
        nll = -logprobs.gather(dim=-1, index=target.unsqueeze(1)).squeeze(1)
        return (self.confidence * nll - self.smoothing * logprobs.mean(dim=-1)).mean()


def train(model, steps, amp, memory_format):
    """The recipe's training loop; the losses and what the last step computed in."""
    criterion = LabelSmoothing().cuda()
    decay = [p for n, p in model.named_parameters() if "bn" not in n]
    no_decay = [p for n, p in model.named_parameters() if "bn" in n]
    optimizer = torch.optim.SGD([{"params": decay, "weight_decay": 1e-4}, {"params": no_decay, "weight_decay": 0}],
                                lr=0.1, momentum=0.875, nesterov=True)
    scaler = torch.cuda.amp.GradScaler(init_scale=128.0, growth_interval=4, enabled=amp)
    loader = DataLoader(Images(BATCH * steps), batch_size=BATCH, shuffle=False, pin_memory=True,
                        collate_fn=lambda batch: fast_collate(batch, memory_format))
    losses = []
    model.train()
    for step, (input, target) in enumerate(prefetched(loader, memory_format)):
        for group in optimizer.param_groups:
            group["lr"] = 0.05 * (1 + math.cos(math.pi * step / steps))
        with torch.cuda.amp.autocast(enabled=amp):
            output = model(input)
            loss = criterion(output, target)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        torch.cuda.synchronize()
        losses.append(loss.item())
    return losses, str(output.dtype)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--script", action="store_true",
                        help="then train the same model again through TorchScript")
    parser.add_argument("--no-amp", action="store_true")
    args = parser.parse_args()
    amp = not args.no_amp

    torch.manual_seed(0)
    torch.backends.cudnn.benchmark = True
    memory_format = torch.channels_last
    model = ResNet().cuda().to(memory_format=memory_format)
    initial = {name: value.clone() for name, value in model.state_dict().items()}
    seen = {}
    seen["losses"], seen["output_dtype"] = train(model, args.steps, amp, memory_format)
    parameter = next(model.parameters())
    seen.update(device=str(parameter.device), is_cuda=parameter.is_cuda,
                channels_last=parameter.is_contiguous(memory_format=memory_format) if parameter.dim() == 4 else None)
    if args.script:
        scripted = ResNet().cuda().to(memory_format=memory_format)
        scripted.load_state_dict(initial)
        seen["scripted_losses"], _ = train(torch.jit.script(scripted), args.steps, amp, memory_format)
    with open(args.out, "w") as out:
        json.dump(seen, out)


if __name__ == "__main__":
    main()
