"""An Accelerate training script as Accelerate's documentation writes one, run with
``accelerate launch [--multi_gpu --num_processes 2] [--mixed_precision fp16|bf16]``.

``Accelerator()`` and ``prepare``, gradient accumulation, ``save_state``/``load_state`` and
``gather_for_metrics``. The main process writes what it saw as JSON.
"""

import argparse
import json
import os

import torch
from accelerate import Accelerator
from accelerate.utils import set_seed
from torch.utils.data import DataLoader, TensorDataset


def dataset(seed, size=64):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 16, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True) / 4)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=2)
    set_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    train = DataLoader(dataset(0), batch_size=8)
    evaluation = DataLoader(dataset(1, size=30), batch_size=8)
    model, optimizer, train, evaluation = accelerator.prepare(model, optimizer, train, evaluation)

    def epoch():
        losses = []
        model.train()
        for x, y in train:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            losses.append(accelerator.gather(loss.detach()).mean().item())
        return losses

    losses = epoch()
    accelerator.save_state(os.path.join(args.checkpoint, "state"))
    continued = epoch()
    accelerator.load_state(os.path.join(args.checkpoint, "state"))
    resumed = epoch()

    model.eval()
    predictions = []
    with torch.no_grad():
        for x, _ in evaluation:
            predictions.append(accelerator.gather_for_metrics(model(x)))
    parameter = next(model.parameters())
    if accelerator.is_main_process:
        with open(args.out, "w") as f:
            json.dump({"distributed_type": str(accelerator.distributed_type), "device": str(accelerator.device),
                       "num_processes": accelerator.num_processes, "mixed_precision": accelerator.mixed_precision,
                       "native_amp": accelerator.native_amp, "scaler": type(accelerator.scaler).__name__,
                       "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
                       "parameter": [str(parameter.device), parameter.is_cuda],
                       "losses": losses, "continued": continued, "resumed": resumed,
                       "evaluated": sum(len(p) for p in predictions)}, f)


if __name__ == "__main__":
    main()
