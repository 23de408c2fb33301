"""A CUDA program that captures work in CUDA graphs the ways PyTorch's CUDA-graph documentation
shows, and runs each the same steps eagerly too: whole-network capture of a training step with
an optimizer (warmed up on a side stream), partial-network capture with
``make_graphed_callables``, two graphs sharing a memory pool, and a decode loop that captures one
token step and replays it. It writes what each computed, graphed and eager, as JSON (argv[1]),
with what it saw of CUDA's capture rules and random numbers."""

import json
import sys

import torch
import torch.nn.functional as F

assert torch.cuda.is_available()
device = torch.device("cuda")
steps = 4


def numbers(tensors):
    return [t.detach().double().cpu().flatten().tolist() for t in tensors]


# --- whole-network capture --------------------------------------------------------------
def whole_network(graphed: bool, adam: bool = False) -> dict:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(32, 8)).cuda()
    loss_fn = torch.nn.MSELoss()
    if adam:                                 # its step counters on the device, no host reads
        optimizer = torch.optim.Adam(model.parameters(), lr=0.01, capturable=True)
    else:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    static_input = torch.randn(6, 16, device="cuda")
    static_target = torch.randn(6, 8, device="cuda")
    real_inputs = [torch.rand_like(static_input) for _ in range(steps)]
    real_targets = [torch.rand_like(static_target) for _ in range(steps)]

    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for i in range(3):
            optimizer.zero_grad(set_to_none=True)
            y_pred = model(static_input)
            loss = loss_fn(y_pred, static_target)
            loss.backward()
            optimizer.step()
    torch.cuda.current_stream().wait_stream(s)

    losses = []
    if graphed:
        g = torch.cuda.CUDAGraph()
        optimizer.zero_grad(set_to_none=True)
        with torch.cuda.graph(g):
            static_y_pred = model(static_input)
            static_loss = loss_fn(static_y_pred, static_target)
            static_loss.backward()
            optimizer.step()
        for data, target in zip(real_inputs, real_targets):
            static_input.copy_(data)
            static_target.copy_(target)
            g.replay()
            losses.append(static_loss.item())
        grads = [p.grad for p in model.parameters()]
    else:
        for data, target in zip(real_inputs, real_targets):
            optimizer.zero_grad(set_to_none=True)
            loss = loss_fn(model(data), target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        grads = [p.grad for p in model.parameters()]
    return {"losses": losses, "parameters": numbers(model.parameters()), "grads": numbers(grads)}


# --- partial-network capture --------------------------------------------------------------
def partial_network(graphed: bool) -> dict:
    torch.manual_seed(1)
    N, D_in, H, D_out = 8, 12, 10, 4
    module1 = torch.nn.Linear(D_in, H).cuda()
    module2 = torch.nn.Linear(H, D_out).cuda()
    module3 = torch.nn.Linear(H, D_out).cuda()
    loss_fn = torch.nn.MSELoss()
    optimizer = torch.optim.SGD(list(module1.parameters()) + list(module2.parameters())
                                + list(module3.parameters()), lr=0.1)
    x = torch.randn(N, D_in, device="cuda")
    h = torch.randn(N, H, device="cuda", requires_grad=True)
    if graphed:
        module1 = torch.cuda.make_graphed_callables(module1, (x,))
        module2 = torch.cuda.make_graphed_callables(module2, (h,))
        module3 = torch.cuda.make_graphed_callables(module3, (h,))
    real_inputs = [torch.rand_like(x) for _ in range(steps)]
    real_targets = [torch.randn(N, D_out, device="cuda") for _ in range(steps)]
    losses = []
    for data, target in zip(real_inputs, real_targets):
        optimizer.zero_grad(set_to_none=True)
        tmp = module1(data)
        if tmp.sum().item() > 0:
            tmp = module2(tmp)
        else:
            tmp = module3(tmp)
        loss = loss_fn(tmp, target)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    parameters = [p for m in (module1, module2, module3) for p in m.parameters()]
    return {"losses": losses, "parameters": numbers(parameters)}


# --- graphs sharing a pool -----------------------------------------------------------------
def shared_pool(graphed: bool) -> dict:
    torch.manual_seed(2)
    w1, w2 = torch.randn(8, 8, device="cuda"), torch.randn(8, 8, device="cuda")
    static_in_1 = torch.randn(4, 8, device="cuda")
    inputs = [torch.randn(4, 8, device="cuda") for _ in range(steps)]
    outs = []
    if graphed:
        g1, g2 = torch.cuda.CUDAGraph(), torch.cuda.CUDAGraph()
        with torch.cuda.graph(g1):
            static_out_1 = torch.tanh(static_in_1 @ w1)
        with torch.cuda.graph(g2, pool=g1.pool()):
            static_out_2 = (static_out_1 @ w2).softmax(-1)
        for data in inputs:
            static_in_1.copy_(data)
            g1.replay()
            g2.replay()
            outs.append(static_out_2.clone())
    else:
        for data in inputs:
            outs.append((torch.tanh(data @ w1) @ w2).softmax(-1))
    return {"outputs": numbers(outs)}


# --- a decode loop that captures one token step --------------------------------------------
class TinyDecoder(torch.nn.Module):
    """One attention layer with a key/value cache of fixed size, as fast inference code keeps
    it for CUDA graphs: the step writes its key and value at the position it is given."""

    def __init__(self, vocab=32, dim=16, length=12):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, dim)
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.out = torch.nn.Linear(dim, vocab)
        self.register_buffer("keys", torch.zeros(1, length, dim))
        self.register_buffer("values", torch.zeros(1, length, dim))
        self.register_buffer("positions", torch.arange(length))

    def step(self, token, position):
        q, k, v = self.qkv(self.embed(token)).chunk(3, dim=-1)         # (1, 1, dim) each
        self.keys.index_copy_(1, position, k)
        self.values.index_copy_(1, position, v)
        visible = (self.positions <= position).view(1, 1, -1)
        scores = (q @ self.keys.transpose(1, 2)).masked_fill(~visible, float("-inf"))
        return self.out(F.softmax(scores / 4.0, dim=-1) @ self.values)[:, -1].argmax(-1, keepdim=True)


@torch.no_grad()
def decode(graphed: bool) -> dict:
    torch.manual_seed(3)
    model = TinyDecoder().cuda().eval()
    token = torch.tensor([[5]], device="cuda")
    position = torch.zeros(1, dtype=torch.long, device="cuda")
    generated = []
    if graphed:
        static_token, static_position = token.clone(), position.clone()
        model.step(static_token, static_position)                       # warm-up
        model.keys.zero_(), model.values.zero_()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            static_next = model.step(static_token, static_position)
        for i in range(10):
            static_position.fill_(i)
            g.replay()
            generated.append(int(static_next))
            static_token.copy_(static_next.view(1, 1))
    else:
        for i in range(10):
            position.fill_(i)
            token = model.step(token, position).view(1, 1)
            generated.append(int(token))
    return {"tokens": generated}


# --- capture rules and random numbers -------------------------------------------------------
def capture_rules() -> dict:
    seen = {}
    x = torch.ones(4, device="cuda")
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            assert torch.cuda.is_current_stream_capturing()
            (x * 2).sum().item()
        seen["item"] = "allowed"
    except RuntimeError as error:
        seen["item"] = str(error)
    seen["capturing_after"] = torch.cuda.is_current_stream_capturing()
    try:
        g.replay()
        seen["replay_after_failed_capture"] = "replayed"
    except RuntimeError as error:
        seen["replay_after_failed_capture"] = str(error)
    return seen


def dropout_replays(seed: int):
    torch.manual_seed(seed)
    static_x = torch.ones(64, device="cuda")
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_y = F.dropout(static_x, p=0.5)
    masks = []
    for _ in range(3):
        g.replay()
        masks.append((static_y > 0).int().tolist())
    return masks


def randomness() -> dict:
    first, again = dropout_replays(7), dropout_replays(7)
    torch.manual_seed(7)
    eager = [(F.dropout(torch.ones(64, device="cuda"), p=0.5) > 0).int().tolist() for _ in range(3)]
    return {"fresh_each_replay": first[0] != first[1] != first[2],
            "reproducible": first == again, "as_eager": first == eager}


def compiled(graphed: bool) -> dict:
    torch.manual_seed(4)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).cuda()
    run = torch.compile(model, mode="reduce-overhead") if graphed else model
    x = torch.randn(3, 8, device="cuda")
    with torch.no_grad():
        return {"outputs": numbers([run(x + i) for i in range(3)])}


scenarios = {"whole_network": whole_network,
             "whole_network_adam": lambda graphed: whole_network(graphed, adam=True),
             "partial_network": partial_network,
             "shared_pool": shared_pool, "decode": decode}
if "--compile" in sys.argv:
    scenarios["compiled"] = compiled
result = {name: {"graphed": run(True), "eager": run(False)} for name, run in scenarios.items()}
result["capture_rules"] = capture_rules()
result["randomness"] = randomness()
with open(sys.argv[1], "w") as out:
    json.dump(result, out)
