"""FSDP's full state dict as GPU programs and Lightning take it: offloaded to the CPU, on rank 0.

Run by torchrun on two ranks. Rank 0 writes whether the gathered state dict equals the
unsharded module's parameters, which every rank computed the same way.
"""

import json
import sys

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FullStateDictConfig, FullyShardedDataParallel as FSDP, StateDictType


def main():
    dist.init_process_group("nccl")
    torch.cuda.set_device(dist.get_rank())
    torch.manual_seed(0)
    plain = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Linear(64, 1))
    expected = {name: tensor.detach().clone() for name, tensor in plain.state_dict().items()}
    model = FSDP(plain.cuda(), device_id=torch.cuda.current_device())
    model(torch.randn(4, 16, device="cuda")).sum().backward()
    config = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
        state = model.state_dict()
    if dist.get_rank() == 0:
        with open(sys.argv[1], "w") as f:
            json.dump({"names": sorted(state) == sorted(expected),
                       "equal": all(torch.equal(state[name], expected[name]) for name in expected)}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
