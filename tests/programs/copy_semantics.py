"""A CUDA program that relies on moves between host and device being copies.

Each idiom is one a real training or inference program uses; each check is True where a move
between host and device copies (CUDA) and a move to where a tensor already is returns it. The
results go to the JSON file named by the first argument.
"""

import copy
import gc
import io
import json
import sys
import threading

import numpy as np
import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda")
checks = {}


def check(name, value):
    checks[name] = bool(value)


def settled_memory_allocated():
    """``torch.cuda.memory_allocated()`` with no garbage pending. torch.save leaves reference
    cycles (its pickler's closures) that hold the storages it saved; the collection that frees
    them falls wherever the interpreter's allocation count says, which differs by host and run,
    and must not fall inside a window measured from here."""
    gc.collect()
    torch.cuda.synchronize()
    return torch.cuda.memory_allocated()


# --- the moves themselves -------------------------------------------------------------------
x = torch.ones(3)
y = x.cuda()
y.add_(1)
check("cuda() copies", x.tolist() == [1, 1, 1])

g = torch.ones(3, device="cuda")
h = g.cpu()
h.mul_(5)
check("cpu() copies", g.cpu().tolist() == [1, 1, 1])

n = torch.ones(3, device="cuda")
a = n.cpu().numpy()
a[0] = 7
check("cpu().numpy() copies", n.cpu().tolist() == [1, 1, 1])

p = torch.ones(3).pin_memory()
q = p.to("cuda", non_blocking=True)
torch.cuda.synchronize()
p.fill_(9)
check("non-blocking from pinned copies", q.cpu().tolist() == [1, 1, 1])
pinned = p.is_pinned()          # where the target pins host memory at all

d = torch.ones(4).to(device)
check("to(device) of a device tensor is itself", d.to(device) is d and d.cuda() is d and d.to("cuda:0") is d)
host = d.cpu()
check("cpu() of a host tensor is itself", host.cpu() is host and host.to("cpu") is host)
converted = torch.ones(2, dtype=torch.float64).to(device, torch.float32)
converted.add_(1)
check("to(device, dtype) converts", converted.dtype == torch.float32)
check("to(copy=True) copies", d.to(device, copy=True) is not d)

source = torch.arange(4.0)
check("as_tensor(device=) copies", torch.as_tensor(source, device=device).add_(1) is not None
      and source.tolist() == [0, 1, 2, 3])
check("tensor(t, device=) copies", torch.tensor(source, device=device).add_(1) is not None
      and source.tolist() == [0, 1, 2, 3])
check("asarray(t, device=) copies", torch.asarray(source, device=device).add_(1) is not None
      and source.tolist() == [0, 1, 2, 3])
on_device = torch.arange(3.0, device=device)
torch.asarray(on_device, device="cpu").add_(1)
check("asarray(device tensor, device='cpu') copies", on_device.cpu().tolist() == [0, 1, 2])
torch.asarray(on_device, device=device).add_(1)
check("asarray(device tensor, device=) shares its memory", on_device.cpu().tolist() == [1, 2, 3])

# an input pipeline that refills one preallocated array for every batch it hands to the device
array = np.zeros((2, 3), dtype=np.float32)
handed = []
for value in (1.0, 2.0):
    array.fill(value)
    handed.append(torch.as_tensor(array, device=device))
array.fill(3.0)
handed.append(torch.asarray(array, device=device))
array.fill(4.0)
check("as_tensor/asarray of a refilled array copy it", [b.cpu()[0, 0].item() for b in handed] == [1, 2, 3])
check("as_tensor of an array on the host shares it", torch.as_tensor(array).add_(1) is not None
      and array[0, 0] == 5)

# legacy tensor types as moves: t.type(torch.cuda.FloatTensor), and back with torch.FloatTensor
legacy = torch.ones(3)
legacy.type(torch.cuda.FloatTensor).add_(1)
legacy.type("torch.cuda.FloatTensor").add_(1)
check("type(torch.cuda.FloatTensor) copies", legacy.tolist() == [1, 1, 1])
legacy_device = torch.ones(3, device=device)
legacy_device.type(torch.FloatTensor).add_(1)
legacy_device.type("torch.FloatTensor").add_(1)
check("type(torch.FloatTensor) of a device tensor copies", legacy_device.cpu().tolist() == [1, 1, 1])

# metrics computed on an array taken with numpy(force=True), edited in place
logits = torch.linspace(-1, 1, 12, device=device, requires_grad=True).view(4, 3) * 2
kept_logits = logits.detach().clone()
probabilities = logits.numpy(force=True)
probabilities[probabilities < 0] = 0
check("numpy(force=True) of a device tensor is a copy", torch.equal(logits.detach(), kept_logits))


# storages moved by themselves: a snapshot of a device tensor's storage, and a checkpoint read with
# the map_location idiom of older programs
weights = torch.ones(4, device=device)
snapshot = weights.untyped_storage().cpu()
typed_snapshot = weights.storage().cpu()
weights.add_(1)
check("storage.cpu() copies", torch.empty(0).set_(snapshot, 0, (4,)).tolist() == [1, 1, 1, 1]
      and typed_snapshot.tolist() == [1, 1, 1, 1])
host_values = torch.ones(4)
on_device_storage = host_values.untyped_storage().cuda()
host_values.add_(1)
check("storage.cuda() copies", torch.empty(0, device=device).set_(on_device_storage, 0, (4,)).cpu().tolist()
      == [1, 1, 1, 1])
buffer = io.BytesIO()
torch.save({"w": torch.arange(3.0)}, buffer)
buffer.seek(0)
restored = torch.load(buffer, map_location=lambda storage, location: storage.cuda())["w"]
check("map_location=lambda storage, loc: storage.cuda()", restored.cpu().tolist() == [0, 1, 2])

# one optimizer checkpoint, read once and restored at the start of each trial of a sweep
swept = nn.Linear(3, 3).to(device)
sweep_optimizer = torch.optim.Adam(swept.parameters(), lr=0.1)


def sweep_step():
    sweep_optimizer.zero_grad()
    swept(torch.ones(2, 3, device=device)).pow(2).sum().backward()
    sweep_optimizer.step()


sweep_step()
buffer = io.BytesIO()
torch.save(sweep_optimizer.state_dict(), buffer)
buffer.seek(0)
optimizer_checkpoint = torch.load(buffer, map_location="cpu")
as_read = copy.deepcopy(optimizer_checkpoint)
sweep_optimizer.load_state_dict(optimizer_checkpoint)
sweep_step()
check("an optimizer's loaded state leaves the checkpoint read", all(
    torch.equal(optimizer_checkpoint["state"][k][name], as_read["state"][k][name])
    for k in as_read["state"] for name in ("exp_avg", "exp_avg_sq")))
check("an optimizer's loaded state is on the parameters' device",
      sweep_optimizer.state[swept.weight]["exp_avg"].device == swept.weight.device)


# --- a small model trained as programs train ----------------------------------------------
def batches(count, seed):
    generator = torch.Generator().manual_seed(seed)
    return [(torch.randn(16, 8, generator=generator), torch.randn(16, 1, generator=generator))
            for _ in range(count)]


model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).cuda()
weight = model[0].weight
model.cuda()
check("module.cuda() again keeps its parameters", model[0].weight is weight)
optimizer = torch.optim.Adam(model.parameters(), lr=0.05)


def step(inputs, targets):
    loss = nn.functional.mse_loss(model(inputs.cuda()), targets.cuda())
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return loss.item()


# early stopping: the best epoch's weights, kept on the host, restored at the end
train = batches(4, 1)
best, best_reference, losses = None, None, []
for epoch in range(3):
    losses.append(sum(step(*batch) for batch in train))
    if epoch == 1:            # the epoch the program judged best
        best = {k: v.detach().cpu() for k, v in model.state_dict().items()}
        best_reference = copy.deepcopy({k: v.detach().clone() for k, v in model.state_dict().items()})
model.load_state_dict(best)
check("early stopping restores the best epoch",
      all(torch.equal(model.state_dict()[k].cpu(), best_reference[k].cpu()) for k in best))

# optimizer state snapshot to the host, as a best-checkpoint keeps it (Adam's step count is a
# host tensor on CUDA too: its .cpu() is itself)
state = optimizer.state[weight]
snapshot = {k: v.cpu() for k, v in state.items() if k != "step"}
reference = {k: v.detach().clone().cpu() for k, v in snapshot.items()}
step(*train[0])
check("optimizer state snapshot on the host stays", all(torch.equal(snapshot[k], reference[k]) for k in snapshot))

# an exponential moving average of the weights kept on the host (EMA/SWA)
ema = {k: v.detach().to("cpu") for k, v in model.state_dict().items()}
before = {k: v.detach().clone() for k, v in model.state_dict().items()}
for k, v in model.state_dict().items():
    ema[k].mul_(0.5).add_(v.detach().cpu(), alpha=0.5)
    ema[k].mul_(0.9)
check("host EMA leaves the model alone", all(torch.equal(model.state_dict()[k], before[k]) for k in before))

# a checkpoint written by a background thread while training goes on
saved_at = {k: v.detach().clone() for k, v in model.state_dict().items()}
host_state = {k: v.cpu() for k, v in model.state_dict().items()}
path = sys.argv[1] + ".ckpt.pt"
disk_ready = threading.Event()
writer = threading.Thread(target=lambda: (disk_ready.wait(), torch.save(host_state, path)))
writer.start()
for batch in train:
    step(*batch)
disk_ready.set()
writer.join()
written = torch.load(path, map_location="cuda")
check("a checkpoint written during training holds the weights of its step",
      all(torch.equal(written[k], saved_at[k]) for k in saved_at))

# post-processing that edits the array in place, while the output is used again
outputs = model(torch.randn(8, 8).cuda())
kept = outputs.detach().clone()
scores = outputs.detach().cpu().numpy()
scores *= 100
scores[scores < 0] = 0
check("editing the array leaves the device output", torch.equal(outputs.detach(), kept))

# a prefetcher that refills one pinned staging buffer after each non-blocking move
staging = torch.empty(16, 8).pin_memory()
stream = torch.cuda.Stream()
arrived, sources = [], batches(3, 2)
for inputs, _ in sources:
    staging.copy_(inputs)
    with torch.cuda.stream(stream):
        arrived.append(staging.to(device, non_blocking=True))
    torch.cuda.current_stream().wait_stream(stream)
torch.cuda.synchronize()
check("a reused pinned staging buffer", all(torch.equal(got.cpu(), inputs) for got, (inputs, _) in zip(arrived, sources)))

# a DataLoader's pinned batches, moved
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.arange(8.0)), batch_size=4,
                                     pin_memory=True)
pinned_batch = next(iter(loader))[0]
moved = pinned_batch.cuda(non_blocking=True)
moved.zero_()
check("a pinned batch moved is a copy", pinned_batch.tolist() == [0, 1, 2, 3])

# activations offloaded to the host by saved-tensor hooks, an in-place op after saving
layer = nn.Linear(8, 8).cuda()
inputs = torch.randn(4, 8).cuda()


def forward(offload):
    hidden = layer(inputs)
    if offload:
        with torch.autograd.graph.saved_tensors_hooks(lambda t: t.cpu(), lambda t: t.cuda()):
            out = hidden * hidden
    else:
        out = hidden * hidden
    hidden.data.add_(1)       # the activation's device memory reused after it was offloaded
    layer.zero_grad()
    out.sum().backward()
    return layer.weight.grad.clone()


with torch.no_grad():
    plain_hidden = layer(inputs)
expected = torch.autograd.grad((layer(inputs) * layer(inputs)).sum(), layer.weight)[0]
check("offloaded activations keep their values", torch.allclose(forward(True), expected, atol=1e-5))

# a module whose parameters are views into one flat buffer (as optimizers that flatten make)
flat_model = nn.Linear(4, 4).cuda()
parameters = list(flat_model.parameters())
flat = torch.cat([p.detach().reshape(-1) for p in parameters])
offset = 0
for parameter in parameters:
    parameter.data = flat[offset:offset + parameter.numel()].view_as(parameter)
    offset += parameter.numel()
flat_model.to(device)
flat.add_(1)
check("flat-buffer views stay views after module.to", torch.equal(flat_model.bias.detach(), flat[-4:]))

# --- devices read off tensors --------------------------------------------------------------
# the idiom of code that does not name its device: "wherever the model is" (transformers'
# model.device is its first parameter's), "wherever that buffer is"
allocated = settled_memory_allocated()
with torch.device(device):
    built_there = nn.Linear(8, 8)                  # a model built on the device, as gpt-fast builds
check("a model built under torch.device('cuda') is device memory",
      torch.cuda.memory_allocated() - allocated >= sum(p.nbytes for p in built_there.parameters()))
model_device = next(built_there.parameters()).device
check("a device read off a parameter built there is the device's",
      model_device == torch.ones(1, device=device).device)
staging = torch.empty(16, 8).pin_memory()
arrived = []
for inputs, _ in sources:
    staging.copy_(inputs)
    arrived.append(staging.to(model_device, non_blocking=True))
torch.cuda.synchronize()
check("a staging buffer moved to model.device", all(torch.equal(got.cpu(), inputs) for got, (inputs, _) in
                                                     zip(arrived, sources)))
labels = torch.arange(4.0)
on_labels_device = labels.to(model[0].weight.device)          # a module moved with .cuda()
on_labels_device.add_(1)
check("to(weight.device) of a moved module copies", labels.tolist() == [0, 1, 2, 3])
scratch = torch.zeros(4, device=device)
moved = labels.to(scratch.device)
moved.mul_(0)
check("to(buffer.device) of a device buffer copies", labels.tolist() == [0, 1, 2, 3])
allocated = settled_memory_allocated()
workspace = torch.empty(1024, device=scratch.device)
check("a tensor made on a device read off a tensor is device memory",
      torch.cuda.memory_allocated() - allocated >= workspace.nbytes)
# buffers made like a device tensor (gradient accumulators, an EMA's shadow, a mask grown by
# new_ones) are on the device: device memory, and a move to their device a copy
allocated = settled_memory_allocated()
accumulators = [torch.zeros_like(p) for p in built_there.parameters()]
grown = scratch.new_ones(256)
check("buffers made like a device tensor are device memory", torch.cuda.memory_allocated() - allocated
      >= sum(a.nbytes for a in accumulators) + grown.nbytes)
moved = labels.to(accumulators[0].device)
moved.add_(1)
check("to(zeros_like(weight).device) copies", labels.tolist() == [0, 1, 2, 3])
allocated = settled_memory_allocated()
host_like = [torch.zeros_like(labels), labels.new_zeros(1024), torch.ones_like(scratch, device="cpu")]
check("a buffer made like a host tensor is not device memory", torch.cuda.memory_allocated() == allocated)

# an EMA model and best weights kept by deepcopy are where the model is: on the device
allocated = settled_memory_allocated()
ema_model = copy.deepcopy(built_there)
best_weights = copy.deepcopy(built_there.state_dict())
check("deepcopy of a device model and its state_dict is device memory", torch.cuda.memory_allocated()
      - allocated >= 2 * sum(p.nbytes for p in built_there.parameters()))
moved = labels.to(next(ema_model.parameters()).device)
moved.add_(1)
check("to(the device of an EMA copy's weights) copies", labels.tolist() == [0, 1, 2, 3])
host_snapshot = copy.deepcopy(scratch.cpu())
check("deepcopy of a host copy stays on the host", host_snapshot.cpu() is host_snapshot)

# a checkpoint read onto the device, in the map_location forms programs write
saved = io.BytesIO()
torch.save({"w": torch.randn(64, 64)}, saved)
loaded = []
for name, location in (('"cuda"', "cuda"), ('torch.device("cuda")', torch.device("cuda")),
                       ("model.device", model_device), ('{"cpu": "cuda"}', {"cpu": "cuda"})):
    saved.seek(0)
    allocated = settled_memory_allocated()
    loaded.append(torch.load(saved, map_location=location)["w"])
    check(f"torch.load(map_location={name}) is device memory",
          torch.cuda.memory_allocated() - allocated >= loaded[-1].nbytes)
moved = labels.to(loaded[0].device)
moved.add_(1)
check("to(a loaded tensor's device) copies", labels.tolist() == [0, 1, 2, 3])

# offloading that remembers where each tensor came from, and refills one host buffer
resident = torch.ones(4, device=device)
host_buffer, came_from = resident.cpu(), resident.device
restored = host_buffer.to(came_from)
host_buffer.fill_(5)
check("a host buffer moved back to where it came from is copied", restored.cpu().tolist() == [1, 1, 1, 1])
back_home = resident.to(host_buffer.device)
back_home.fill_(3)
check("to(host_tensor.device) of a device tensor copies", resident.cpu().tolist() == [1, 1, 1, 1])
check("a move to the device a tensor is on returns it",
      resident.to(resident.device) is resident and host_buffer.to(host_buffer.device) is host_buffer
      and built_there.weight.to(model_device) is built_there.weight and labels.to(labels.device) is labels)

with open(sys.argv[1], "w") as out:
    json.dump({"checks": checks, "losses": losses, "pinned": pinned}, out, indent=1)
