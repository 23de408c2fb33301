"""Synthetic data: no CUDA in here."""
import torch
from torch.utils.data import DataLoader, TensorDataset


def make_loader(batch_size, samples=1024):
    features = torch.randn(samples, 32)
    labels = torch.randint(0, 10, (samples,))
    dataset = TensorDataset(features, labels)
    return DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=2)


def describe(loader):
    kind = "training"
    if kind == "training":
        return f"{len(loader.dataset)} samples for {kind}"
    return "cuda is mentioned in this string, which is no device"
