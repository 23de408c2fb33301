"""A Hugging Face ``Trainer`` script as its documentation writes one, for GPUs.

``TrainingArguments(fp16=True, ...)`` (or ``bf16=True``) and ``Trainer.train``, a checkpoint every few steps,
then training resumed from the first checkpoint with ``resume_from_checkpoint``, and
``Trainer.evaluate``. Launched by ``torchrun`` (DDP, one GPU a rank) or as one process that
sees every GPU (the Trainer wraps the model in ``nn.DataParallel``). The main process writes
what it saw as JSON.
"""

import argparse
import json
import os

import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(Dataset):
    def __init__(self, seed, size):
        generator = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (size, 16), generator=generator)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, index):
        return {"input_ids": self.ids[index], "labels": self.ids[index]}


def trainer(output_dir, find_unused_parameters, precision):
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=2, n_positions=16,
                                       bos_token_id=0, eos_token_id=0))
    arguments = TrainingArguments(output_dir=output_dir, per_device_train_batch_size=4, max_steps=6,
                                  fp16=precision == "fp16", bf16=precision == "bf16",
                                  learning_rate=1e-3, logging_steps=1, save_steps=3, report_to=[], seed=0,
                                  disable_tqdm=True, ddp_find_unused_parameters=find_unused_parameters)
    return Trainer(model=model, args=arguments, train_dataset=Tokens(0, 64), eval_dataset=Tokens(1, 16))


def losses(trainer):
    return {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--ddp-find-unused-parameters", choices=["true", "false"],
                        help="the Trainer's default: true for a model without gradient checkpointing")
    parser.add_argument("--precision", choices=["fp16", "bf16"], default="fp16",
                        help="the Trainer's mixed precision: --fp16, or --bf16, which it gates on "
                             "torch.cuda.is_bf16_supported()")
    args = parser.parse_args()
    find_unused = None if args.ddp_find_unused_parameters is None else args.ddp_find_unused_parameters == "true"

    first = trainer(args.output_dir, find_unused, args.precision)
    first.train()
    resumed = trainer(args.output_dir, find_unused, args.precision)
    resumed.train(resume_from_checkpoint=os.path.join(args.output_dir, "checkpoint-3"))
    evaluated = resumed.evaluate()
    parameter = next(resumed.model.parameters())
    if resumed.is_world_process_zero():
        with open(args.out, "w") as f:
            json.dump({"device": str(resumed.args.device), "n_gpu": resumed.args.n_gpu,
                       "parallel_mode": str(resumed.args.parallel_mode), "world_size": resumed.args.world_size,
                       "wrapped": type(resumed.model_wrapped).__name__,
                       "scaler": type(resumed.accelerator.scaler).__name__,
                       "mixed_precision": resumed.accelerator.mixed_precision,
                       "backend": torch.distributed.get_backend() if torch.distributed.is_initialized() else None,
                       "parameter": [str(parameter.device), parameter.is_cuda],
                       "losses": losses(first), "resumed": losses(resumed), "eval_loss": evaluated["eval_loss"]},
                      f)


if __name__ == "__main__":
    main()
