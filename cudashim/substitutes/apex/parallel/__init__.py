"""apex.parallel: DistributedDataParallel and SyncBatchNorm on torch's own."""

from __future__ import annotations

import torch
from torch.nn.parallel import DistributedDataParallel as _TorchDDP

from cudashim.substitutes._refuse import refusal, refusing_getattr

SyncBatchNorm = torch.nn.SyncBatchNorm


class DistributedDataParallel(_TorchDDP):
    """apex.parallel.DistributedDataParallel: torch's DDP, which averages gradients across
    ranks as apex's does by default (``gradient_predivide_factor`` only moves where the
    division happens). apex's bucketing and stream options choose how, not what."""

    def __init__(self, module, message_size=10000000, delay_allreduce=False, shared_param=None,
                 allreduce_trigger_params=None, retain_allreduce_buffers=False,
                 allreduce_always_fp32=False, num_allreduce_streams=1,
                 allreduce_communicators=None, gradient_average=True,
                 gradient_predivide_factor=1.0, gradient_average_split_factor=None, prof=False):
        if not gradient_average:
            raise refusal("apex.parallel.DistributedDataParallel(gradient_average=False)",
                          "torch's DDP averages; register a comm hook that sums instead")
        super().__init__(module)


def convert_syncbn_model(module, process_group=None, channel_last=False):
    return torch.nn.SyncBatchNorm.convert_sync_batchnorm(module, process_group)


__getattr__ = refusing_getattr(__name__, {
    "LARC": "use torch.optim with a per-layer learning-rate scheduler",
    "Reducer": "use torch.distributed.all_reduce",
})
