"""A tiny GPT trained with megatron-core the way Megatron-LM's ``pretrain_gpt.py`` trains one.

``pretrain_gpt.py`` reaches megatron-core through ``megatron.training`` (which is not on
PyPI); this program makes the same calls in the same order, written for NVIDIA GPUs:
``torch.cuda.set_device`` and the NCCL backend, ``parallel_state.initialize_model_parallel``,
``model_parallel_cuda_manual_seed``, the model built on the current CUDA device and wrapped
in ``Float16Module`` and megatron's ``DistributedDataParallel``, ``get_megatron_optimizer``
with fp16 (a ``DynamicGradScaler``), batches broadcast over the tensor-parallel group, the
pipeline schedule from ``get_forward_backward_func``, and ``dist_checkpointing`` saving and
loading the model, optimizer and RNG states (``torch_dist`` format, fully parallel save).

The tests run it unmodified under ``python -m cudashim -m torch.distributed.run`` with
tensor parallelism 2, or pipeline parallelism 2, on two ranks. Every rank writes what it
saw as JSON (``--out DIR``); a run with ``--load`` resumes from a saved checkpoint. The
first steps start from a loss scale that overflows float16, so the scaler skips and backs off.
"""

import argparse
import json
import os
from datetime import timedelta
from functools import partial

import torch
from megatron.core import dist_checkpointing, parallel_state, tensor_parallel
from megatron.core.dist_checkpointing.mapping import ShardedObject
from megatron.core.dist_checkpointing.serialization import (get_default_load_sharded_strategy,
                                                            get_default_save_sharded_strategy)
from megatron.core.dist_checkpointing.strategies.fully_parallel import (FullyParallelLoadStrategyWrapper,
                                                                        FullyParallelSaveStrategyWrapper)
from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.transformer.module import Float16Module
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.utils import unwrap_model

VOCAB, SEQUENCE, MICRO_BATCH, MICRO_BATCHES = 128, 16, 2, 2


def initialize(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    torch.distributed.init_process_group(backend="nccl", world_size=int(os.environ["WORLD_SIZE"]),
                                         rank=int(os.environ["RANK"]), timeout=timedelta(minutes=10),
                                         device_id=torch.device(f"cuda:{local_rank}"))
    parallel_state.initialize_model_parallel(tensor_model_parallel_size=args.tp,
                                             pipeline_model_parallel_size=args.pp,
                                             distributed_timeout_minutes=10, order="tp-cp-ep-dp-pp")
    torch.manual_seed(1234)
    tensor_parallel.model_parallel_cuda_manual_seed(1234)


def model_provider(args):
    config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, fp16=True,
                               params_dtype=torch.float16, pipeline_dtype=torch.float16,
                               tensor_model_parallel_size=args.tp, pipeline_model_parallel_size=args.pp)
    return GPTModel(config=config, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=VOCAB,
                    max_sequence_length=SEQUENCE, pre_process=parallel_state.is_pipeline_first_stage(),
                    post_process=parallel_state.is_pipeline_last_stage())


def get_model(args):
    model = model_provider(args)
    model.cuda(torch.cuda.current_device())
    model = Float16Module(model.config, model)
    ddp_config = DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                               use_distributed_optimizer=False)
    return DistributedDataParallel(config=model.config, ddp_config=ddp_config, module=model)


def batches(step, micro_batches=MICRO_BATCHES):
    """A next-token task the model can learn: each sequence counts up from a random start.
    Tensor-parallel rank 0 makes the batch on the GPU and broadcasts it, as Megatron does."""
    for micro in range(micro_batches):
        tokens = torch.empty(MICRO_BATCH, SEQUENCE + 1, dtype=torch.int64, device=torch.cuda.current_device())
        if parallel_state.get_tensor_model_parallel_rank() == 0:
            generator = torch.Generator().manual_seed(1000 * step + micro)
            start = torch.randint(0, VOCAB, (MICRO_BATCH, 1), generator=generator)
            tokens.copy_(((start + torch.arange(SEQUENCE + 1)) % VOCAB).cuda(non_blocking=True))
        torch.distributed.broadcast(tokens, parallel_state.get_tensor_model_parallel_src_rank(),
                                    group=parallel_state.get_tensor_model_parallel_group())
        yield {"tokens": tokens[:, :-1].contiguous(), "labels": tokens[:, 1:].contiguous()}


def loss_func(loss_mask, output_tensor):
    losses = output_tensor.float()
    loss = torch.sum(losses.view(-1) * loss_mask.view(-1)) / loss_mask.sum()
    return loss, {"lm loss": loss}


def forward_step(data_iterator, model):
    batch = next(data_iterator)
    tokens, labels = batch["tokens"], batch["labels"]
    position_ids = torch.arange(SEQUENCE, device=tokens.device).unsqueeze(0).expand_as(tokens)
    loss_mask = torch.ones(tokens.shape, dtype=torch.float, device=tokens.device)
    output_tensor = model(tokens, position_ids, None, labels=labels)
    return output_tensor, partial(loss_func, loss_mask)


def train_step(model, optimizer, step):
    model.zero_grad_buffer()
    optimizer.zero_grad()
    reduced = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=batches(step), model=[model],
                                          num_microbatches=MICRO_BATCHES, seq_length=SEQUENCE,
                                          micro_batch_size=MICRO_BATCH, forward_only=False)
    scale = optimizer.get_loss_scale().item()
    update_successful, grad_norm, _ = optimizer.step()
    return {"loss": _mean_loss(reduced), "scale": scale, "updated": bool(update_successful),
            "grad_norm": None if grad_norm is None else float(grad_norm), "eval_loss": evaluate(model)}


def evaluate(model):
    """The loss on a held-out batch, as Megatron-LM evaluates: forward only, no gradients."""
    model.eval()
    with torch.no_grad():
        reduced = get_forward_backward_func()(forward_step_func=forward_step, data_iterator=batches(-1, 1),
                                              model=[model], num_microbatches=1, seq_length=SEQUENCE,
                                              micro_batch_size=MICRO_BATCH, forward_only=True)
    model.train()
    return _mean_loss(reduced)


def _mean_loss(reduced):
    """The losses the schedule reduced, on the last pipeline stage (None elsewhere)."""
    if not parallel_state.is_pipeline_last_stage():
        return None
    return sum(r["lm loss"].item() for r in reduced) / len(reduced)


def state_dict(model, optimizer, iteration, loading=False):
    """What Megatron-LM's torch_dist checkpoints hold: the unwrapped model's and the
    optimizer's sharded states, the iteration, and every rank's RNG states."""
    rng = {"random_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.cuda.get_rng_state(),
           "rng_tracker_states": tensor_parallel.get_cuda_rng_tracker().get_states()}
    pp, tp = parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_tensor_model_parallel_rank()
    model_state = unwrap_model(model).sharded_state_dict()
    return {"model": model_state, "optimizer": optimizer.sharded_state_dict(model_state, is_loading=loading),
            "iteration": iteration,
            "rng_state": ShardedObject("rng_state", [rng], (parallel_state.get_pipeline_model_parallel_world_size(),
                                                             parallel_state.get_tensor_model_parallel_world_size()),
                                       (pp, tp), replica_id=parallel_state.get_data_parallel_rank())}


def save_checkpoint(directory, model, optimizer, iteration):
    os.makedirs(directory, exist_ok=True)
    strategy = FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy("torch_dist"),
                                                parallel_state.get_data_parallel_group(with_context_parallel=True))
    dist_checkpointing.save(state_dict(model, optimizer, iteration), directory, strategy)


def load_checkpoint(directory, model, optimizer):
    strategy = FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(directory),
                                                parallel_state.get_data_parallel_group(with_context_parallel=True))
    loaded = dist_checkpointing.load(state_dict(model, optimizer, 0, loading=True), directory, strategy)
    unwrap_model(model).load_state_dict(loaded["model"])
    optimizer.load_state_dict(loaded["optimizer"])
    rng = loaded["rng_state"][0]
    torch.set_rng_state(rng["random_rng_state"])
    torch.cuda.set_rng_state(rng["cuda_rng_state"])
    tensor_parallel.get_cuda_rng_tracker().set_states(rng["rng_tracker_states"])
    return loaded["iteration"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tp", type=int, default=1, help="tensor model parallel size")
    parser.add_argument("--pp", type=int, default=1, help="pipeline model parallel size")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--save-at", type=int, help="save a checkpoint after this many steps")
    parser.add_argument("--save", help="checkpoint directory to save to")
    parser.add_argument("--load", help="checkpoint directory to resume from")
    parser.add_argument("--initial-loss-scale", type=float, default=2.0 ** 20)
    parser.add_argument("--out", required=True, help="directory for each rank's JSON")
    args = parser.parse_args()

    initialize(args)
    model = get_model(args)
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=3e-3, weight_decay=0.01, clip_grad=1.0, fp16=True,
                        params_dtype=torch.float16, initial_loss_scale=args.initial_loss_scale,
                        loss_scale_window=4, hysteresis=1), [model])
    model.config.grad_scale_func = optimizer.scale_loss          # what megatron.training sets up
    model.config.finalize_model_grads_func = finalize_model_grads

    first = load_checkpoint(args.load, model, optimizer) if args.load else 0
    steps = []
    for step in range(first, first + args.steps):
        steps.append(train_step(model, optimizer, step))
        if args.save and step + 1 == args.save_at:
            save_checkpoint(args.save, model, optimizer, step + 1)

    parameter = next(model.parameters())
    # Weights every tensor-parallel rank holds whole (norms, position embeddings, biases
    # after a row-parallel layer) must stay equal across those ranks.
    replicated = sum(p.double().sum().item() for p in model.parameters()
                     if not getattr(p, "tensor_model_parallel", False))
    seen = {"rank": torch.distributed.get_rank(), "backend": torch.distributed.get_backend(),
            "tp_rank": parallel_state.get_tensor_model_parallel_rank(),
            "pp_rank": parallel_state.get_pipeline_model_parallel_rank(),
            "optimizers": [f"{type(o).__name__}, {type(o.grad_scaler).__name__}"
                           for o in getattr(optimizer, "chained_optimizers", [optimizer])],
            "parameter": [str(parameter.device), str(parameter.dtype), parameter.is_cuda],
            "replicated": replicated, "first_step": first, "steps": steps}
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"rank{seen['rank']}.json"), "w") as f:
        json.dump(seen, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
