"""An unmodified multi-node NCCL trainer, as people write them for torchrun's elastic launches
and for Slurm: it snapshots every epoch and resumes from the last snapshot when restarted.

    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint node0:29400 \
        elastic_ddp.py --snapshot /shared/snapshot.pt --out /shared/final.pt
    srun python elastic_ddp.py ...         (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, MASTER_ADDR)

The faults it can be asked to meet (``--fault KIND --fault-rank R --fault-at EPOCH:STEP``), on
the first attempt only (torchrun counts restarts in TORCHELASTIC_RESTART_COUNT): ``kill``, the
rank SIGKILLs itself (a node's OOM killer); ``raise``, it raises; ``hang``, it stops taking part
while the others go on into their next collective.
"""

import argparse
import datetime
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=3)
parser.add_argument("--batch-size", type=int, default=8)
parser.add_argument("--snapshot", required=True)
parser.add_argument("--out", required=True, help="rank 0 saves the final weights and losses here")
parser.add_argument("--timeout", type=float, default=60, help="seconds a collective may take")
parser.add_argument("--fault", choices=["kill", "raise", "hang"])
parser.add_argument("--fault-rank", type=int, default=1)
parser.add_argument("--fault-at", default="1:3", help="EPOCH:STEP")
args = parser.parse_args()

if "RANK" in os.environ:                   # torchrun, DeepSpeed's launcher
    rank, world, local_rank = (int(os.environ[name]) for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"))
else:                                      # srun: one task per rank
    rank, world, local_rank = (int(os.environ[name]) for name in ("SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"))
torch.cuda.set_device(local_rank)
dist.init_process_group("nccl", init_method="env://", rank=rank, world_size=world,
                        timeout=datetime.timedelta(seconds=args.timeout))
attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
device = torch.device("cuda", local_rank)

torch.manual_seed(0)
data = TensorDataset(torch.randn(512, 16), torch.randn(512, 1))
model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 1)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
first_epoch, losses = 0, []
if os.path.exists(args.snapshot):
    snapshot = torch.load(args.snapshot, map_location=f"cuda:{local_rank}")
    model.load_state_dict(snapshot["model"])
    optimizer.load_state_dict(snapshot["optimizer"])
    first_epoch, losses = snapshot["epoch"] + 1, snapshot["losses"]
    print(f"rank {rank}: resumed at epoch {first_epoch} (attempt {attempt})", flush=True)
ddp = DDP(model, device_ids=[local_rank])
sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=0)
loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler)
fault_epoch, fault_step = (int(part) for part in args.fault_at.split(":"))

for epoch in range(first_epoch, args.epochs):
    sampler.set_epoch(epoch)
    for step, (x, y) in enumerate(loader):
        if args.fault and attempt == 0 and (rank, epoch, step) == (args.fault_rank, fault_epoch, fault_step):
            print(f"rank {rank}: {args.fault} at epoch {epoch} step {step}", flush=True)
            if args.fault == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            elif args.fault == "raise":
                raise RuntimeError(f"rank {rank} failed at epoch {epoch} step {step}")
            else:
                time.sleep(3600)
        x, y = x.cuda(non_blocking=True), y.cuda(non_blocking=True)
        optimizer.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean, op=dist.ReduceOp.AVG)
        losses.append(mean.item())
    if rank == 0:                          # a snapshot only once the epoch is whole
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                    "epoch": epoch, "losses": losses}, args.snapshot + ".tmp")
        os.replace(args.snapshot + ".tmp", args.snapshot)
    dist.barrier()

if rank == 0:
    torch.save({"model": model.state_dict(), "losses": losses}, args.out)
    print(json.dumps({"world": world, "steps": len(losses), "last_loss": losses[-1]}), flush=True)
dist.destroy_process_group()
