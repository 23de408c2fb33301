"""A DeepSpeed trainer written for NVIDIA GPUs, as DeepSpeed's tutorials write one.

The tests run it unmodified under ``python -m cudashim``, on one rank and on two with the
``deepspeed`` launcher: ``cuda`` devices, the NCCL backend, fp16 or bf16, ZeRO stage 1, 2 or 3
(``deepspeed.zero.Init`` for stage 3), optimizer states offloaded to the host, states
offloaded and reloaded, a checkpoint saved and resumed; or, without ZeRO, the 1-bit
optimizers with the communication backend GPU programs name (``"nccl"``) or DeepSpeed's
``"compressed"``, several trained one after another as a sweep does. Rank 0 writes what it
saw as JSON.
"""

import argparse
import json
import os

import torch
import deepspeed
from deepspeed.accelerator import get_accelerator


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 64),
                                        torch.nn.GELU(), torch.nn.Linear(64, 1))

    def forward(self, x):
        return self.body(x)


def batches(seed, steps, dtype):
    generator = torch.Generator().manual_seed(seed + 1000 * torch.distributed.get_rank())
    for _ in range(steps):
        x = torch.randn(8, 16, generator=generator)
        yield x.cuda().to(dtype), x.sum(1, keepdim=True).cuda().to(dtype) / 4


def train(engine, seed, steps, dtype):
    losses = []
    for x, y in batches(seed, steps, dtype):
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    return losses


def count_compressed_allreduces(optimizer):
    """What a 1-bit optimizer communicates with: its backend's class, and a count of its
    compressed allreduces (the test's probe; the training is unchanged)."""
    handle = getattr(optimizer, "comm_backend_handle", None)
    if handle is None:
        return None
    seen = {"backend": f"{type(handle).__module__}.{type(handle).__name__}", "calls": 0}
    compressed_allreduce = handle.compressed_allreduce

    def counted(*args, **kwargs):
        seen["calls"] += 1
        return compressed_allreduce(*args, **kwargs)

    handle.compressed_allreduce = counted
    return seen


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--local_rank", type=int, default=int(os.environ.get("LOCAL_RANK", 0)))
    parser.add_argument("--stage", type=int, default=2)
    parser.add_argument("--dtype", choices=["fp16", "bf16"], default="fp16")
    parser.add_argument("--offload-optimizer", action="store_true")
    parser.add_argument("--offload-states", action="store_true", help="ZeRO-3: offload and reload")
    parser.add_argument("--optimizer", default="AdamW",
                        help="AdamW, OneBitAdam, ZeroOneAdam or OneBitLamb; several, comma-separated, "
                             "train one after another in this process (a sweep)")
    parser.add_argument("--comm-backend", choices=["nccl", "compressed"], default="nccl",
                        help="the 1-bit optimizers' comm_backend_name")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()

    deepspeed.init_distributed(dist_backend="nccl")
    torch.cuda.set_device(args.local_rank)
    names = args.optimizer.split(",")
    runs = {name: train_with(args, name, os.path.join(args.checkpoint, name)) for name in names}
    if torch.distributed.get_rank() == 0:
        with open(args.out, "w") as f:
            json.dump(runs[names[0]] if len(names) == 1 else {"runs": runs}, f)


def train_with(args, optimizer_name, checkpoint):
    """Train, save, continue, resume: what the rank saw."""
    dtype = torch.float16 if args.dtype == "fp16" else torch.bfloat16
    zero = {"stage": args.stage}
    if args.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
    precision = {"enabled": True, "initial_scale_power": 8} if args.dtype == "fp16" else {"enabled": True}
    optimizer = {"type": "AdamW", "params": {"lr": 3e-3, "weight_decay": 0.01}}
    if optimizer_name != "AdamW":            # 1-bit: compressed from the fourth step on
        optimizer = {"type": optimizer_name,
                     "params": {"lr": 1e-3, "freeze_step": 3, "var_freeze_step": 3, "cuda_aware": False,
                                "comm_backend_name": args.comm_backend}}
        if optimizer_name == "ZeroOneAdam":
            del optimizer["params"]["freeze_step"]
        else:
            del optimizer["params"]["var_freeze_step"]
    config = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 1,
              "gradient_clipping": 1.0, args.dtype: precision, "zero_optimization": zero,
              "optimizer": optimizer, "steps_per_print": 1000}

    torch.manual_seed(0)
    with deepspeed.zero.Init(config_dict_or_path=config, enabled=args.stage == 3):
        model = Model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)

    compressed_calls = count_compressed_allreduces(engine.basic_optimizer)
    losses = train(engine, seed=0, steps=args.steps, dtype=dtype)
    engine.save_checkpoint(checkpoint, tag="mid")
    continued = train(engine, seed=1, steps=2, dtype=dtype)
    if args.offload_states:
        engine.offload_states()
        engine.reload_states()
        after_reload = train(engine, seed=2, steps=1, dtype=dtype)
    else:
        after_reload = None
    engine.load_checkpoint(checkpoint, tag="mid")
    resumed = train(engine, seed=1, steps=2, dtype=dtype)

    parameter = next(engine.module.parameters())
    return {"accelerator": get_accelerator().device_name(),
            "communication": get_accelerator().communication_backend_name(),
            "world_size": torch.distributed.get_world_size(),
            "backend": torch.distributed.get_backend(),
            "parameter": [str(parameter.device), str(parameter.dtype), parameter.is_cuda],
            "losses": losses, "continued": continued, "resumed": resumed,
            "after_reload": after_reload, "onebit": compressed_calls}


if __name__ == "__main__":
    main()
