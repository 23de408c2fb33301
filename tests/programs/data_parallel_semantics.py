"""What CUDA's single-process multi-GPU code promises, asked of two CUDA devices.

A CUDA program: nn.DataParallel over cuda:0 and cuda:1, the functional data_parallel,
replicate/scatter/parallel_apply/gather by hand, and torch.cuda.comm. Each check compares
with what one device computes by itself, the way CUDA's semantics define it. Writes
{check: value} as JSON to argv[1]: booleans for the checks, numbers to compare across targets.
"""

import io
import json
import sys
import threading

import torch
import torch.nn as nn
from torch.cuda import comm

assert torch.cuda.device_count() >= 2, "run with two CUDA devices"
torch.manual_seed(0)
dev0 = torch.device("cuda:0")
seen = {}


def close(a, b, tol=1e-5):
    return bool(torch.allclose(a.detach().cpu().float(), b.detach().cpu().float(), rtol=tol, atol=tol))


# --- DataParallel equals the module on one device, gradients reduced onto cuda:0 ---------
mlp = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3)).cuda()
x, target = torch.randn(10, 6).cuda(), torch.randn(10, 3).cuda()
dp = nn.DataParallel(mlp)                       # every device, as most programs write it
seen["device_ids"] = dp.device_ids
loss = nn.functional.mse_loss(dp(x), target)
loss.backward()
dp_grads = [p.grad.clone() for p in mlp.parameters()]
mlp.zero_grad()
single = nn.functional.mse_loss(mlp(x), target)
single.backward()
seen["loss_matches_one_device"] = close(loss, single)
seen["grads_match_one_device"] = all(close(a, p.grad) for a, p in zip(dp_grads, mlp.parameters()))
seen["grads_on_first_device"] = all(p.grad.is_cuda and p.grad.device == mlp[0].weight.device
                                    for p in mlp.parameters())
seen["loss"] = loss.item()

# A CPU input is scattered onto the devices; the output comes back on output_device.
host_input = torch.randn(7, 6)
out = dp(host_input)
seen["host_input_output_on_device"] = out.is_cuda and out.device == mlp[0].weight.device
seen["host_input_matches"] = close(out, mlp(host_input.cuda()))

# --- BatchNorm: each replica normalizes its own chunk; running stats come from cuda:0's ----
bn = nn.BatchNorm1d(4).cuda()
batch = torch.randn(8, 4).cuda() * 3 + 1
out = nn.DataParallel(bn, device_ids=[0, 1])(batch)
reference = nn.BatchNorm1d(4).cuda()
expected = torch.cat([reference(batch[:4]), nn.BatchNorm1d(4).cuda()(batch[4:])])
seen["batchnorm_per_replica_statistics"] = close(out, expected)
seen["batchnorm_running_mean_from_first_replica"] = close(bn.running_mean, reference.running_mean)
seen["batchnorm_batches_tracked"] = int(bn.num_batches_tracked)


# --- kwargs are scattered, dim=1 splits the other way, and each replica knows its device ----
class Probe(nn.Module):
    def __init__(self):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(()))
        self.devices, self.dtypes = [], []

    def forward(self, x, weight=None, label=""):
        self.devices.append(torch.cuda.current_device())
        self.dtypes.append(torch.mm(x, x.t()).dtype)
        return (x * weight * self.scale).sum(1, keepdim=True) if weight is not None else x * self.scale


probe = Probe().cuda()
dp = nn.DataParallel(probe, device_ids=[0, 1])
x, weight = torch.arange(24.0).view(6, 4).cuda(), torch.linspace(0, 1, 6).view(6, 1).cuda()
seen["kwargs_scattered"] = close(dp(x, weight=weight, label="rows"), (x * weight).sum(1, keepdim=True))
seen["replica_devices"] = sorted(probe.devices[-2:])
dp_cols = nn.DataParallel(Probe().cuda(), device_ids=[0, 1], dim=1)
cols = torch.arange(12.0).view(3, 4).cuda()
seen["dim_1"] = close(dp_cols(cols), cols)
with torch.autocast("cuda"):                     # the caller's autocast holds in every replica
    dp(x)
    in_caller = torch.mm(x, x.t()).dtype
seen["autocast_in_replicas"] = [str(d) for d in probe.dtypes[-2:]]
seen["autocast_as_in_caller"] = probe.dtypes[-2:] == [in_caller] * 2
with torch.no_grad():
    seen["no_grad_forward"] = close(dp(x), x)

# A replica's error reaches the caller, naming the replica.
class Fails(nn.Module):
    def forward(self, x):
        if torch.cuda.current_device() == 1:
            raise ValueError("replica one fails")
        return x


try:
    nn.DataParallel(Fails(), device_ids=[0, 1])(torch.ones(4, 2).cuda())
    seen["replica_error"] = None
except ValueError as error:
    seen["replica_error"] = str(error).splitlines()[0]

# --- state_dict keys, module access and a checkpoint round trip ------------------------
model = nn.DataParallel(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).cuda())
model(torch.randn(6, 3).cuda())
buffer = io.BytesIO()
torch.save(model.state_dict(), buffer)
buffer.seek(0)
saved = torch.load(buffer)
seen["state_dict_keys"] = sorted(saved)[:2]
restored = nn.DataParallel(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).cuda())
restored.load_state_dict(saved)
plain = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).cuda()
plain.load_state_dict({k.removeprefix("module."): v for k, v in saved.items()})
seen["checkpoint_round_trip"] = all(close(a, b) for a, b in zip(model.module.state_dict().values(),
                                                                  restored.module.state_dict().values()))
seen["module_access"] = isinstance(model.module, nn.Sequential) and close(plain[0].weight, model.module[0].weight)

# --- the functional form and the primitives by hand --------------------------------------
net = nn.Sequential(nn.Linear(5, 5), nn.ReLU()).cuda()
x = torch.randn(9, 5).cuda()
seen["data_parallel_function"] = close(nn.parallel.data_parallel(net, x, range(2)), net(x))
replicas = nn.parallel.replicate(net, [0, 1])
seen["replicas_own_parameters"] = replicas[0][0].weight.data_ptr() != replicas[1][0].weight.data_ptr()
chunks = nn.parallel.scatter(x, [0, 1])
outputs = nn.parallel.parallel_apply(replicas, chunks, devices=[0, 1])
seen["by_hand"] = close(nn.parallel.gather(outputs, 0), net(x))
on_host = nn.parallel.gather(outputs, "cpu")
seen["gathered_on_host"] = on_host.device.type == "cpu" and close(on_host, net(x))

# --- torch.cuda.comm --------------------------------------------------------------------
t = torch.arange(6.0).cuda()
copies = comm.broadcast(t, [0, 1])
seen["broadcast_keeps_source"] = copies[0] is t
copies[1].add_(1)
seen["broadcast_copies_are_their_own"] = close(t, torch.arange(6.0)) and close(copies[1], torch.arange(6.0) + 1)
a, b = torch.ones(3).cuda(), torch.full((3,), 2.0).cuda()
seen["broadcast_coalesced"] = [len(d) for d in comm.broadcast_coalesced([a, b], [0, 1])]
seen["reduce_add"] = comm.reduce_add([a, b], 0).tolist()
seen["reduce_add_coalesced"] = [r.tolist() for r in comm.reduce_add_coalesced([[a, b], [b, a]], 0)]
seen["scatter_sizes"] = [p.shape[0] for p in comm.scatter(torch.arange(10.0).cuda(), [0, 1], [3, 7])]
seen["gather"] = comm.gather([a, b], 0, 0).tolist()
out = torch.empty(6).cuda()
comm.gather([a, b], out=out)
seen["gather_out"] = out.tolist()
try:
    comm.reduce_add([a.cpu(), b], 0)
    seen["reduce_add_host_input"] = None
except (AssertionError, RuntimeError) as error:
    seen["reduce_add_host_input"] = type(error).__name__

json.dump(seen, open(sys.argv[1], "w"), indent=1)
print("ok", threading.active_count())
