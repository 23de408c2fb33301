"""A Ray Train script for GPUs, as Ray's documentation writes one.

``TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2, use_gpu=True))``: Ray
starts a local cluster, schedules two workers on a GPU each, and each trains a DDP model made
by ``prepare_model`` on batches from ``prepare_data_loader``, reporting its metrics and, on
rank 0, a checkpoint. Each worker writes what it saw as JSON beside the driver's.
"""

import argparse
import json
import os
import tempfile

import ray
import ray.train
import torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer, get_device, prepare_data_loader, prepare_model
from torch.utils.data import DataLoader, TensorDataset


def train_func(config):
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    data = prepare_data_loader(DataLoader(TensorDataset(x, x.sum(1, keepdim=True) / 4), batch_size=8))
    model = prepare_model(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 1)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    context = ray.train.get_context()
    losses = []
    for epoch in range(2):
        for inputs, targets in data:
            loss = torch.nn.functional.mse_loss(model(inputs), targets)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if context.get_world_rank() == 0:
                torch.save(model.module.state_dict(), os.path.join(folder, "model.pt"))
                checkpoint = Checkpoint.from_directory(folder)
            ray.train.report({"epoch": epoch, "loss": loss.item()}, checkpoint=checkpoint)
    parameter = next(model.parameters())
    seen = {"rank": context.get_world_rank(), "world_size": context.get_world_size(),
            "device": str(get_device()), "device_is_cuda": torch.empty(0, device=get_device()).is_cuda,
            "parameter": [str(parameter.device), parameter.is_cuda], "wrapped": type(model).__name__,
            "backend": torch.distributed.get_backend(), "cuda_devices": torch.cuda.device_count(),
            "losses": losses, "weights": sum(p.detach().double().sum().item() for p in model.parameters())}
    with open(os.path.join(config["out"], f"rank{seen['rank']}.json"), "w") as f:
        json.dump(seen, f)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--storage", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    ray.init(include_dashboard=False)
    gpus = ray.cluster_resources().get("GPU", 0)
    trainer = TorchTrainer(train_func, train_loop_config={"out": args.out},
                           scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
                           run_config=RunConfig(storage_path=args.storage, name="run"))
    result = trainer.fit()
    with open(os.path.join(args.out, "driver.json"), "w") as f:
        json.dump({"cluster_gpus": gpus, "checkpoint": result.checkpoint.path if result.checkpoint else None}, f)
    ray.shutdown()


if __name__ == "__main__":
    main()
