"""DistributedDataParallel set-up, as torchrun launches it."""
import os

import torch
import torch.distributed as dist
from torch import cuda
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(model):
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda.set_device(local_rank)  # scan: handled
    dist.init_process_group(backend="nccl")  # scan: handled
    assert dist.get_backend() == dist.Backend.NCCL  # scan: handled
    model = model.to(f"cuda:{local_rank}")  # scan: handled
    ddp = DDP(model, device_ids=[local_rank], output_device=local_rank)
    if torch.cuda.get_device_capability()[0] >= 8:  # scan: handled
        torch.backends.cuda.matmul.allow_tf32 = True  # scan: handled
    return ddp


def capture(step):
    graph = torch.cuda.CUDAGraph()  # scan: handled
    with torch.cuda.graph(graph):  # scan: handled
        step()
    return graph


def cleanup():
    dist.destroy_process_group()


def pooled():
    return torch.cuda.MemPool()  # scan: needs a change


def sequence_parallel(model, tokens):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.experimental import context_parallel

    mesh = init_device_mesh("cuda", (dist.get_world_size(),))  # scan: handled
    with context_parallel(mesh, buffers=[tokens], buffer_seq_dims=[1]):  # scan: handled
        return model(tokens)
