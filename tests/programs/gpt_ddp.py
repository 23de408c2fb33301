"""A GPT trained with DDP on NCCL, as torchrun trainers for GPUs are written: train, save a
checkpoint on rank 0, destroy the process group."""

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

block_size, n_embd, n_head, n_layer, vocab = 16, 32, 4, 2, 32


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(n_embd), nn.LayerNorm(n_embd)
        self.qkv, self.proj = nn.Linear(n_embd, 3 * n_embd), nn.Linear(n_embd, n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = (t.view(B, T, n_head, C // n_head).transpose(1, 2)
                   for t in self.qkv(self.ln1(x)).split(n_embd, dim=2))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, n_embd), nn.Embedding(block_size, n_embd)
        self.blocks = nn.Sequential(*[Block() for _ in range(n_layer)])
        self.head = nn.Linear(n_embd, vocab)

    def forward(self, idx, targets):
        x = self.blocks(self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device)))
        logits = self.head(x)
        return F.cross_entropy(logits.view(-1, vocab), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--out", required=True)
    parser.add_argument("--exit-report", help="test instrument: write the threads left at exit")
    parser.add_argument("--step-times", help="rank 0 writes each step's wall time in seconds here as JSON")
    args = parser.parse_args()
    if args.exit_report:
        import exit_probe
        exit_probe.report_at_exit(f"{args.exit_report}.rank{os.environ['RANK']}.json")

    dist.init_process_group("nccl")
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.manual_seed(1337)
    model = DDP(GPT().cuda(), device_ids=[local_rank])
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    scaler = torch.cuda.amp.GradScaler()
    step_times = []
    for _ in range(args.steps):
        began = time.perf_counter()
        x = torch.randint(vocab, (4, block_size + 1), device="cuda")
        with torch.autocast("cuda", dtype=torch.float16):
            loss = model(x[:, :-1], x[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        loss.item()
        step_times.append(time.perf_counter() - began)
    if args.step_times and dist.get_rank() == 0:
        with open(args.step_times, "w") as f:
            json.dump(step_times, f)
    if dist.get_rank() == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict()}, args.out)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
