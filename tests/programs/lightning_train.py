"""A Lightning program written for GPUs, as Lightning's documentation writes one.

The tests run it unmodified under ``python -m cudashim``: a LightningModule trained by
``Trainer(accelerator="gpu", devices=..., strategy=..., precision=...)``, a checkpoint written
by ``ModelCheckpoint`` and training resumed from it with ``ckpt_path``, then ``Trainer.test``;
or the same model in a loop of its own with ``Fabric(accelerator="cuda")``. Rank 0 writes what it saw as JSON.
"""

import argparse
import json
import os

import torch
import lightning as L
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset


def dataset(seed, size=64):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(size, 16, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True) / 4)


class Regressor(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1))
        self.losses = []
        self.seen = {}
        self.shared = None                  # whether this rank's weights are in shared memory

    def forward(self, x):
        return self.body(x)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self(x), y)
        self.losses.append(loss.item())
        self.seen = {"device": str(self.device), "batch_is_cuda": x.is_cuda}
        self.shared = any(parameter.is_shared() for parameter in self.parameters())
        self.log("train_loss", loss, sync_dist=True)
        return loss

    def on_train_end(self):
        if self.shared is not None:         # ddp_spawn's ranks: the test reads their answer
            print(f"rank {self.global_rank} trained weights in shared memory: {self.shared}", flush=True)

    def test_step(self, batch, batch_idx):
        x, y = batch
        self.log("test_loss", torch.nn.functional.mse_loss(self(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=3e-3)


def trainer(args, root, **options):
    return L.Trainer(accelerator=args.accelerator, devices=args.devices, strategy=args.strategy,
                     precision=args.precision, default_root_dir=root, logger=False,
                     enable_progress_bar=False, enable_model_summary=False, **options)


def train(args):
    L.seed_everything(0)
    data = DataLoader(dataset(0), batch_size=8)
    model = Regressor()
    initial = [parameter.detach().clone() for parameter in model.parameters()]
    checkpoint = ModelCheckpoint(dirpath=args.checkpoint, save_last=True)
    first = trainer(args, args.checkpoint, max_epochs=1, callbacks=[checkpoint])
    first.fit(model, data)
    if args.once:                           # fit, then test: no resume
        tested = first.test(model, DataLoader(dataset(1), batch_size=8), verbose=False)
        return {"accelerator": type(first.accelerator).__name__, "root_device": str(first.strategy.root_device),
                "world_size": first.world_size, "test_loss": tested[0]["test_loss"], "rank": first.global_rank,
                "trained": not all(torch.equal(a, b) for a, b in zip(initial, model.parameters()))}
    last = os.path.join(args.checkpoint, "last.ckpt")      # ddp_spawn's ranks wrote it, not this process
    continued = Regressor()
    second = trainer(args, args.checkpoint, max_epochs=2)
    second.fit(continued, data, ckpt_path=last)
    again = Regressor()
    third = trainer(args, args.checkpoint, max_epochs=2)
    third.fit(again, data, ckpt_path=last)
    if args.strategy == "fsdp":             # FSDP shards the fitted module in place: a fresh one tests
        third.save_checkpoint(os.path.join(args.checkpoint, "resumed.ckpt"))
        tested = third.test(Regressor(), DataLoader(dataset(1), batch_size=8), verbose=False,
                            ckpt_path=os.path.join(args.checkpoint, "resumed.ckpt"))
    else:
        tested = third.test(again, DataLoader(dataset(1), batch_size=8), verbose=False)
    parameter = next(again.parameters())
    strategy = third.strategy
    return {"accelerator": type(third.accelerator).__name__, "strategy": type(strategy).__name__,
            "precision": [type(third.precision_plugin).__name__, getattr(third.precision_plugin, "device", None)],
            "root_device": str(strategy.root_device), "world_size": third.world_size,
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
            "parameter": [str(parameter.device), parameter.is_cuda],
            "losses": model.losses, "continued": continued.losses, "resumed": again.losses,
            "same_weights": all(torch.equal(a, b) for a, b in zip(continued.parameters(), again.parameters())),
            "trained": not all(torch.equal(a, b) for a, b in zip(model.parameters(), again.parameters())),
            "step": model.seen, "test_loss": tested[0]["test_loss"], "rank": third.global_rank}


def train_with_fabric(args):
    """The same model in a Fabric loop: launch, setup, backward, save and load."""
    fabric = L.Fabric(accelerator=args.accelerator, devices=args.devices, strategy=args.strategy,
                      precision=args.precision)
    fabric.launch()
    fabric.seed_everything(0)
    model = Regressor()
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model, optimizer = fabric.setup(model, optimizer)
    data = fabric.setup_dataloaders(DataLoader(dataset(0), batch_size=8))

    def epoch():
        losses = []
        for x, y in data:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
            losses.append(fabric.all_reduce(loss.detach(), reduce_op="mean").item())
        return losses

    losses = epoch()
    path = os.path.join(args.checkpoint, "fabric.ckpt")
    fabric.save(path, {"model": model, "optimizer": optimizer})
    continued = epoch()
    fabric.load(path, {"model": model, "optimizer": optimizer})
    resumed = epoch()
    parameter = next(model.parameters())
    return {"accelerator": type(fabric.accelerator).__name__, "strategy": type(fabric.strategy).__name__,
            "precision": [type(fabric._precision).__name__, getattr(fabric._precision, "device", None)],
            "root_device": str(fabric.device), "world_size": fabric.world_size,
            "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
            "parameter": [str(parameter.device), parameter.is_cuda],
            "losses": losses, "continued": continued, "resumed": resumed, "rank": fabric.global_rank}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--loop", choices=["trainer", "fabric"], default="trainer")
    parser.add_argument("--accelerator", default="gpu")
    parser.add_argument("--devices", default="1")
    parser.add_argument("--strategy", default="auto")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--once", action="store_true", help="the Trainer fits once, then tests")
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    args.devices = int(args.devices) if args.devices.lstrip("-").isdigit() else args.devices
    seen = train(args) if args.loop == "trainer" else train_with_fabric(args)
    if seen["rank"] == 0:
        with open(args.out, "w") as f:
            json.dump(seen, f)


if __name__ == "__main__":
    main()
