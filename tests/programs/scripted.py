"""TorchScript as CUDA programs write it, at module level (compiled when imported)."""

from typing import Optional

import torch


@torch.jit.script
def bias_gelu(bias, y):
    """Megatron's fused bias + GeLU."""
    x = bias + y
    return x * 0.5 * (1.0 + torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x)))


@torch.jit.script
def padding_mask(lengths: torch.Tensor, max_len: int):
    """Calls patched factories (torch.arange, torch.zeros) with a CUDA device constant."""
    positions = torch.arange(max_len, device=torch.device("cuda", 0))
    counts = torch.zeros(lengths.shape[0], device="cuda")
    return positions[None, :] < lengths[:, None].cuda() + counts[:, None].long()


def moved_to(x: torch.Tensor, device: torch.device):
    return x.to(device)


@torch.jit.script
class RunningMean:
    def __init__(self, device: torch.device):
        self.total = torch.zeros(1, device=device)
        self.count = 0

    def add(self, x: torch.Tensor):
        self.total = self.total + x.to(torch.device("cuda")).sum()
        self.count += x.numel()

    def mean(self) -> torch.Tensor:
        return self.total / self.count


@torch.jit.script
def mean_of(x: torch.Tensor) -> torch.Tensor:
    """Calls a scripted class whose method names a CUDA device."""
    running = RunningMean(torch.device("cuda"))
    running.add(x)
    return running.mean()


class Block(torch.nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.proj = torch.nn.Linear(width, width)

    def forward(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None):
        h = self.proj(self.norm(x.to("cuda")))
        if bias is None:
            bias = torch.zeros(h.shape[-1], device=torch.device("cuda"))
        return bias_gelu(bias, h)
