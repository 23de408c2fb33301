"""SyncBatchNorm on the host, as it runs on CUDA.

``nn.SyncBatchNorm`` refuses host tensors twice: its ``forward`` raises for any device type
but CUDA, HPU, XPU and the PrivateUse1 one before it looks at the world size, and
``DistributedDataParallel`` refuses to wrap a module holding one when the module lives in
host memory. On the CPU target, where a CUDA program's devices are the host, both would stop
programs written with ``--sync-bn`` (torchvision's and timm's trainers). Here the forward
takes the host where CUDA's is taken, the same steps as torch's: the running statistics
move as ``_BatchNorm`` moves them, and on more than one rank torch's own ``SyncBatchNorm``
function gathers the statistics (its CUDA-only ops are cudashim's portable kernels,
``kernels/cuda_only_ops.py``). Every other call reaches torch's forward unchanged.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F


def forward_on_the_host(original):
    from torch.nn.modules._functions import SyncBatchNorm as sync_batch_norm

    dist = torch.distributed

    @functools.wraps(original)
    def forward(self, input):
        if input.device.type != "cpu" or not self.training \
                or not (dist.is_available() and dist.is_initialized()):
            return original(self, input)                  # no check in its way
        self._check_input_dim(input)
        self._check_non_zero_input_channels(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:                     # cumulative moving average
                factor = 1.0 / self.num_batches_tracked.item()
        running_mean = self.running_mean if self.track_running_stats else None
        running_var = self.running_var if self.track_running_stats else None
        group = self.process_group or dist.group.WORLD
        world_size = dist.get_world_size(group)
        if world_size == 1:
            return F.batch_norm(input, running_mean, running_var, self.weight, self.bias, True,
                                factor, self.eps)
        return sync_batch_norm.apply(input, self.weight, self.bias, running_mean, running_var,
                                     self.eps, factor, group, world_size)
    return forward


def ddp_accepts_it_on_the_host(original):
    """DistributedDataParallel's check, which refuses SyncBatchNorm in host modules."""
    @functools.wraps(original)
    def passing_sync_batchnorm_handle(self, module):
        if self.device_type != "cpu":
            return original(self, module)
    return passing_sync_batchnorm_handle
