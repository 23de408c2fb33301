"""Data and tensor parallelism on a 2-D device mesh, written for CUDA as the FSDP2 + TP
tutorials and the training frameworks write it.

torchrun --nproc-per-node N mesh_parallel.py OUT.json [--rng-only] [--then-mixed]
                                          [--save DIR --save-step K | --resume DIR --save-step K]

The mesh is (data, tensor) parallel: tensor parallel over two ranks where there are two, data
parallel over the rest. Rank 0 writes to OUT.json:
- ``rng``: DTensor's random ops (seeded by torch.manual_seed, as the frameworks do): replicated
  draws equal on every rank, shards that differ, generators in step afterwards;
- ``attention``: scaled_dot_product_attention on DTensors (batch over the data-parallel ranks,
  heads over the tensor-parallel ones; with a per-head mask; with the sequence sharded): the
  largest difference of its output and gradients from attention on the whole tensors;
- ``context_parallel``: a training step of the transformer with its sequence sharded over the
  tensor-parallel ranks by context parallelism, as torchtitan writes it (the tokens and labels
  are the context's buffers, attention asks for CUDA's kernels): the tokens each rank kept and
  the largest relative difference of the loss and gradients from the whole sequence's (None on
  a torch without context parallelism);
- ``resharded``: a tensor sharded by rows over the tensor-parallel ranks, resharded by columns (an
  all-to-all, which torch makes of an all-gather and a slice only on a CPU mesh), equals the tensor;
- ``losses``: a few training steps of a tiny transformer (TP plan, SequenceParallel norms, causal
  attention on DTensors with their heads sharded as torchtitan keeps them, fully_shard over the
  data-parallel dimension), and ``reference``: the same steps of the unsharded model on one device;
- a sharded torch.distributed.checkpoint save at step K, or a resume from one made by a run
  with another world size;
- ``mixed`` (``--then-mixed``): the same steps trained again afterwards, by the same ranks, from
  the same weights, with MixedPrecisionPolicy(bfloat16) and CPUOffloadPolicy.

A resumed run (``--resume``) computes what resuming needs: ``rng``, and ``losses`` from step K on
(no attention, context parallelism, resharding or reference, which the run that saved computed).
``--rng-only`` stops after the random ops (torch before 2.6, whose FSDP2 does not compose with TP).
"""

import argparse
import hashlib
import json
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

try:
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
    import torch.distributed.tensor as dtensor
except ImportError:                                          # torch before 2.6
    from torch.distributed._composable.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    from torch.distributed._tensor import DTensor, Replicate, Shard, distribute_tensor
    import torch.distributed._tensor as dtensor

VOCAB, DIM, HIDDEN, SEQ, BATCH, STEPS = 64, 32, 64, 8, 4, 6
HEADS = 4


class Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.wq = nn.Linear(DIM, DIM, bias=False)
        self.wk = nn.Linear(DIM, DIM, bias=False)
        self.wv = nn.Linear(DIM, DIM, bias=False)
        self.wo = nn.Linear(DIM, DIM, bias=False)

    def forward(self, x):
        batch, seq, _ = x.shape
        # -1 heads: the local count where the projections are sharded (plain tensors), the whole
        # count where they stay DTensors
        q, k, v = (w(x).view(batch, seq, -1, DIM // HEADS).transpose(1, 2) for w in (self.wq, self.wk, self.wv))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(batch, seq, -1))


class FeedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1 = nn.Linear(DIM, HIDDEN, bias=False)
        self.w2 = nn.Linear(HIDDEN, DIM, bias=False)
        self.w3 = nn.Linear(DIM, HIDDEN, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_norm = nn.LayerNorm(DIM)
        self.attention = Attention()
        self.norm = nn.LayerNorm(DIM)
        self.feed_forward = FeedForward()

    def forward(self, x):
        x = x + self.attention(self.attention_norm(x))
        return x + self.feed_forward(self.norm(x))


class Transformer(nn.Module):
    def __init__(self):
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, DIM)
        self.layers = nn.ModuleList(Block() for _ in range(2))
        self.norm = nn.LayerNorm(DIM)
        self.output = nn.Linear(DIM, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.embedding(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def tensor_parallel(model, tp_mesh):
    parallelize_module(model, tp_mesh, {
        "embedding": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
    })
    for block in model.layers:
        parallelize_module(block, tp_mesh, {
            "attention_norm": SequenceParallel(),
            "attention": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "attention.wq": ColwiseParallel(use_local_output=False),
            "attention.wk": ColwiseParallel(use_local_output=False),
            "attention.wv": ColwiseParallel(use_local_output=False),
            "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
            "feed_forward.w1": ColwiseParallel(),
            "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),
            "feed_forward.w3": ColwiseParallel(),
        })


def parallelized(model, mesh, bf16, offload):
    tensor_parallel(model, mesh["tp"])
    policy = {}
    if bf16:
        policy["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    if offload:
        policy["offload_policy"] = CPUOffloadPolicy()
    for block in model.layers:
        fully_shard(block, mesh=mesh["dp"], **policy)
    return fully_shard(model, mesh=mesh["dp"], **policy)


def gathered(tensor):
    """The local tensors of every rank, on this one."""
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size())]
    dist.all_gather(parts, tensor.contiguous())
    return parts


def digest(tensor) -> str:
    return hashlib.sha256(tensor.detach().float().cpu().numpy().tobytes()).hexdigest()[:16]


def random_ops(mesh):
    """DTensor's random ops on the mesh, as model initialization and dropout run them."""
    torch.manual_seed(1234)
    replicated = distribute_tensor(torch.empty(64, device="cuda"), mesh, [Replicate(), Replicate()])
    replicated.normal_()
    sharded = dtensor.rand(8, 8, device_mesh=mesh, placements=[Shard(0), Shard(1)])
    rows = distribute_tensor(torch.ones(8, 16, device="cuda"), mesh, [Shard(0), Replicate()])
    dropped = F.dropout(rows, p=0.5)
    after = torch.rand(4, device="cuda")
    local = replicated.to_local()
    blocks = sharded.full_tensor().reshape(mesh.size(0), 8 // mesh.size(0), mesh.size(1), 8 // mesh.size(1))
    blocks = [blocks[i, :, j] for i in range(mesh.size(0)) for j in range(mesh.size(1))]
    masks = gathered(dropped.to_local())
    coordinates = gathered(torch.tensor(mesh.get_coordinate(), device="cuda"))
    same_rows = [(a, b) for a in range(len(masks)) for b in range(a + 1, len(masks))
                 if coordinates[a][0] == coordinates[b][0]]
    other_rows = [(a, b) for a in range(len(masks)) for b in range(a + 1, len(masks))
                  if coordinates[a][0] != coordinates[b][0]]
    return {
        "device": str(local.device),
        "replicated_equal": all(torch.equal(part, local) for part in gathered(local)),
        "replicated": digest(local),
        "normal_mean": float(local.mean()),
        "shards_differ": all(not torch.equal(a, b) for i, a in enumerate(blocks) for b in blocks[i + 1:]),
        "dropout_replicas_equal": all(torch.equal(masks[a], masks[b]) for a, b in same_rows),
        "dropout_shards_differ": all(not torch.equal(masks[a], masks[b]) for a, b in other_rows),
        "dropout_kept": float((dropped.full_tensor() != 0).float().mean()),
        "in_step": all(torch.equal(part, after) for part in gathered(after)),
    }


def resharded(mesh):
    """Rows to columns over the tensor-parallel ranks: DTensor's all-to-all. True where the
    result is the tensor; what the collective library said where it refused."""
    tp_mesh = mesh["tp"]
    whole = torch.arange(48, dtype=torch.float32, device="cuda").reshape(6, 8)
    try:
        by_columns = distribute_tensor(whole, tp_mesh, [Shard(0)]).redistribute(tp_mesh, [Shard(1)])
    except RuntimeError as refused:
        return str(refused)
    return by_columns.to_local().shape[1] == 8 // tp_mesh.size() and torch.equal(by_columns.full_tensor(), whole)


def attention_on_shards(mesh):
    """Attention on DTensors as data and tensor parallelism shard them, against the whole tensors."""
    generator = torch.Generator().manual_seed(7)
    q, k, v = (torch.randn(2 * mesh.size(0), 4, 6, 8, generator=generator).cuda() for _ in range(3))
    per_head_mask = torch.randn(4, 6, 6, generator=generator).cuda()
    seen = {}
    for name, placements, kwargs in (("batch_and_heads", [Shard(0), Shard(1)], {"is_causal": True}),
                                     ("per_head_mask", [Shard(0), Shard(1)], {"attn_mask": per_head_mask}),
                                     ("sequence", [Replicate(), Shard(2)], {"is_causal": True})):
        whole = [t.clone().requires_grad_() for t in (q, k, v)]
        expected = F.scaled_dot_product_attention(*whole, **kwargs)
        expected.sum().backward()
        shards = [distribute_tensor(t, mesh, placements).requires_grad_() for t in (q, k, v)]
        out = F.scaled_dot_product_attention(*shards, **kwargs)
        # a replicated output's full_tensor() fails in backward on torch 2.7, natively too
        # ("redistribute failed!": equal placements, no transform): its local tensor is the whole
        whole_out = out.full_tensor() if any(p.is_shard() for p in out.placements) else out.to_local()
        whole_out.sum().backward()
        differences = [whole_out - expected] + [s.grad.full_tensor() - w.grad for s, w in zip(shards, whole)]
        seen[name] = {"placements": [str(p) for p in out.placements],
                      "difference": max(float(d.abs().max()) for d in differences)}
    return seen


def context_parallel_step(mesh):
    """One step of the transformer under context parallelism over the tensor-parallel ranks,
    against the same step on the whole sequence."""
    try:
        from torch.distributed.tensor.experimental import context_parallel
    except ImportError:                                      # torch before 2.5
        return None
    from torch.nn.attention import SDPBackend, sdpa_kernel

    cp_mesh = mesh["tp"]
    torch.manual_seed(1)
    model = Transformer().cuda()
    tokens = batches()[0].cuda()
    inputs, labels = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()

    def step():
        loss = F.cross_entropy(model(inputs).reshape(-1, VOCAB), labels.reshape(-1), reduction="sum")
        loss.backward()
        return loss.detach()

    expected = [step(), *(p.grad.clone() for p in model.parameters())]
    model.zero_grad()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]):
        with context_parallel(cp_mesh, buffers=[inputs, labels], buffer_seq_dims=[1, 1],
                              no_restore_buffers={inputs, labels}):
            loss = step()
    computed = [loss, *(p.grad for p in model.parameters())]
    for tensor in computed:                                  # the sequence's parts, summed
        dist.all_reduce(tensor, group=cp_mesh.get_group())
    return {"tokens_per_rank": inputs.shape[1],
            "difference": max(float((c - e).abs().max() / e.abs().max()) for c, e in zip(computed, expected))}


def batches():
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=generator) for _ in range(STEPS)]


def train(model, optimizer, data, first, losses, mesh=None, save=None):
    dp_rank, dp_size = (0, 1) if mesh is None else (mesh["dp"].get_local_rank(), mesh["dp"].size())
    for step in range(first, STEPS):
        if save and step == save[1]:
            model_state, optimizer_state = get_state_dict(model, optimizer)
            dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=save[0])
        tokens = data[step].cuda()
        tokens = tokens.chunk(dp_size)[dp_rank]
        logits = model(tokens[:, :-1])
        if isinstance(logits, DTensor):
            logits = logits.full_tensor()
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        reported = loss.detach().clone()
        if mesh is not None:
            dist.all_reduce(reported, group=mesh["dp"].get_group())
            reported /= dp_size
        losses.append(float(reported))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--rng-only", action="store_true")
    parser.add_argument("--then-mixed", action="store_true")
    parser.add_argument("--save")
    parser.add_argument("--resume")
    parser.add_argument("--save-step", type=int, default=3)
    args = parser.parse_args()

    dist.init_process_group("nccl")
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    world = dist.get_world_size()
    tp = 2 if world % 2 == 0 else 1
    mesh = init_device_mesh("cuda", (world // tp, tp), mesh_dim_names=("dp", "tp"))
    seen = {"world": world, "mesh": list(mesh.shape), "rng": random_ops(mesh)}
    if not args.resume:
        seen.update(resharded=resharded(mesh), attention=attention_on_shards(mesh),
                    context_parallel=context_parallel_step(mesh))
    if not args.rng_only:
        seen.update(trained(mesh, args, bf16=False, offload=False))
        if args.then_mixed:
            seen["mixed"] = trained(mesh, args, bf16=True, offload=True, checkpoints=False)["losses"]
    dist.barrier()
    if dist.get_rank() == 0:
        with open(args.out, "w") as out:
            json.dump(seen, out)
    dist.destroy_process_group()


def trained(mesh, args, bf16, offload, checkpoints=True):
    """Train the parallelized model and, from the same initial weights, the unsharded one."""
    seen = {}
    torch.manual_seed(0)
    reference = Transformer().cuda()
    model = Transformer().cuda()
    model.load_state_dict(reference.state_dict())
    model = parallelized(model, mesh, bf16, offload)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = batches()
    first, losses = 0, []
    if args.resume and checkpoints:
        model_state, optimizer_state = get_state_dict(model, optimizer)
        state = {"model": model_state, "optimizer": optimizer_state}
        dcp.load(state, checkpoint_id=args.resume)
        set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optimizer"])
        first = args.save_step
    save = (args.save, args.save_step) if args.save and checkpoints else None
    train(model, optimizer, data, first, losses, mesh, save)
    seen["losses"] = losses
    seen["parameter"] = [type(next(model.parameters())).__name__,
                         str(next(model.parameters()).to_local().device)]

    if not checkpoints or args.resume or dist.get_rank() != 0:
        return seen                     # the reference is rank 0's to write
    reference_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
    seen["reference"] = []
    train(reference, reference_optimizer, data, 0, seen["reference"])
    return seen


if __name__ == "__main__":
    main()
