"""CUDA programs whose tensors are not all dense: a graph convolutional network written as the
classic GCN scripts write one (the row-normalized adjacency built as a sparse COO tensor on the
host and moved with ``.cuda()``, each layer ``torch.spmm(adj, input @ weight)``, Adam, the
adjacency saved with the model and loaded back), and again over a CSR adjacency, as graph
libraries keep one for their sparse-dense products, beside a block-sparse (BSR) linear layer
converted on the device; node embeddings trained with
``nn.Embedding(sparse=True)`` and ``SparseAdam`` (``--embeddings``); and a Transformer encoder
serving padded batches under ``no_grad``, where torch computes on a nested tensor; and a convnet
trained for quantization (fake quantization on the device, int8 on the host). Writes what
it saw as JSON (argv[1])."""

import argparse
import io
import json

import torch
import torch.nn as nn
import torch.nn.functional as F

NODES, FEATURES, HIDDEN, CLASSES = 40, 12, 16, 3


def normalized_adjacency(generator):
    edges = torch.randint(0, NODES, (2, 120), generator=generator)
    edges = torch.cat([edges, edges.flip(0), torch.arange(NODES).repeat(2, 1)], dim=1)
    values = torch.ones(edges.shape[1])
    adj = torch.sparse_coo_tensor(edges, values, (NODES, NODES)).coalesce()
    degree = torch.sparse.sum(adj, dim=1).to_dense()
    row = adj.indices()[0]
    return torch.sparse_coo_tensor(adj.indices(), adj.values() / degree[row], adj.shape)


class GraphConvolution(nn.Module):
    def __init__(self, inputs, outputs):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(inputs, outputs))
        self.bias = nn.Parameter(torch.zeros(outputs))
        nn.init.xavier_uniform_(self.weight)

    def forward(self, x, adj):
        return torch.spmm(adj, x @ self.weight) + self.bias


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        self.gc1 = GraphConvolution(FEATURES, HIDDEN)
        self.gc2 = GraphConvolution(HIDDEN, CLASSES)

    def forward(self, x, adj):
        return F.log_softmax(self.gc2(F.relu(self.gc1(x, adj)), adj), dim=1)


def train_gcn_steps(model, features, adj, labels, steps):
    """The GCN scripts' loop: Adam with weight decay, full-batch steps; the losses."""
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01, weight_decay=5e-4)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.nll_loss(model(features, adj), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def train_gcn(seen):
    generator = torch.Generator().manual_seed(0)
    adj = normalized_adjacency(generator)
    features = torch.randn(NODES, FEATURES, generator=generator)
    labels = torch.randint(0, CLASSES, (NODES,), generator=generator)
    torch.manual_seed(0)
    model = GCN().cuda()
    adj, features, labels = adj.cuda(), features.cuda(), labels.cuda()
    seen.update(adj_device=str(adj.device), adj_is_cuda=adj.is_cuda, adj_layout=str(adj.layout),
                adj_nnz=adj._nnz())
    seen["gcn_losses"] = train_gcn_steps(model, features, adj, labels, steps=8)
    seen["rows_summed"] = torch.sparse.sum(adj, dim=1).to_dense().cpu().tolist()

    buffer = io.BytesIO()
    torch.save({"model": model.state_dict(), "adj": adj}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)
    seen["reloaded_adj"] = [str(loaded["adj"].device), str(loaded["adj"].layout),
                            bool(torch.equal(loaded["adj"].to_dense().cpu(), adj.to_dense().cpu()))]
    host = adj.cpu()
    seen["host_copy"] = [str(host.device), str(host.layout)]


def compressed_layouts(seen, checkpoint):
    """The GCN over the adjacency in CSR; a weight made block-sparse (BSR) and column-compressed
    (CSC) where it lives; an in-place scale; a checkpoint and a host copy."""
    generator = torch.Generator().manual_seed(0)
    adj = normalized_adjacency(generator).to_sparse_csr().cuda()
    features = torch.randn(NODES, FEATURES, generator=generator).cuda()
    labels = torch.randint(0, CLASSES, (NODES,), generator=generator).cuda()
    torch.manual_seed(0)
    model = GCN().cuda()
    seen["csr_losses"] = train_gcn_steps(model, features, adj, labels, steps=6)
    seen["csr"] = [str(adj.device), str(adj.layout), str(adj.crow_indices().device), adj._nnz()]

    weight = torch.randn(HIDDEN, FEATURES, generator=generator).cuda()
    inputs = torch.randn(5, FEATURES, generator=generator).cuda()
    blocks = weight.to_sparse_bsr((4, 4))
    seen["bsr"] = [str(blocks.device), str(blocks.layout), str(blocks.values().device),
                   list(blocks.values().shape)]
    seen["bsr_linear"] = F.linear(inputs, blocks).cpu().tolist()
    seen["dense_linear"] = F.linear(inputs, weight).cpu().tolist()
    columns = weight.to_sparse_csc()
    seen["csc"] = [str(columns.device), str(columns.layout),
                   bool(torch.equal(columns.to_dense().cpu(), weight.cpu()))]

    scaled = adj.clone()
    scaled.mul_(0.5)                                 # computed on the host, written back
    scaled.values().mul_(4.0)                        # the device's own values tensor
    seen["scaled"] = [scaled.values().sum().item(), adj.values().sum().item(), str(scaled.device)]

    buffer = io.BytesIO()
    torch.save({"adj": adj}, buffer)
    buffer.seek(0)
    loaded = torch.load(buffer)["adj"]
    seen["reloaded_csr"] = [str(loaded.device), str(loaded.layout),
                            bool(torch.equal(loaded.to_dense().cpu(), adj.to_dense().cpu()))]
    torch.save({"adj": adj}, checkpoint)            # for a machine without cudashim to load
    host = adj.cpu()
    seen["host_csr"] = [str(host.device), str(host.layout), bool(torch.equal(host.to_dense(), adj.to_dense().cpu()))]


def quantization_aware_training(seen):
    """A convnet prepared for quantization-aware training (torch.ao.quantization, the qconfig of
    this host's quantized engine) trained on the device, then converted to int8 on the host, as
    the QAT recipes do: its fake quantization is dense ops, which every target computes."""
    import torch.ao.quantization as quantization
    torch.manual_seed(0)
    model = nn.Sequential(quantization.QuantStub(), nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(),
                          nn.Flatten(), nn.Linear(8 * 6 * 6, CLASSES), quantization.DeQuantStub())
    model.qconfig = quantization.get_default_qat_qconfig(torch.backends.quantized.engine)
    quantization.prepare_qat(model.train(), inplace=True)
    model = model.cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    generator = torch.Generator().manual_seed(2)
    images = torch.randn(16, 3, 8, 8, generator=generator).cuda()
    labels = torch.randint(0, CLASSES, (16,), generator=generator).cuda()
    losses = []
    for _ in range(4):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    converted = quantization.convert(model.cpu().eval())
    seen["qat_losses"] = losses
    seen["qat_int8"] = converted(images.cpu()).tolist()


def train_embeddings(seen):
    torch.manual_seed(0)
    embedding = nn.Embedding(NODES, 8, sparse=True).cuda()
    head = nn.Linear(8, CLASSES).cuda()
    sparse_optimizer = torch.optim.SparseAdam(list(embedding.parameters()), lr=0.05)
    dense_optimizer = torch.optim.Adam(head.parameters(), lr=0.05)
    generator = torch.Generator().manual_seed(1)
    nodes = torch.randint(0, NODES, (16,), generator=generator).cuda()
    labels = torch.randint(0, CLASSES, (16,), generator=generator).cuda()
    before = embedding.weight.detach().cpu().clone()
    losses = []
    for _ in range(5):
        sparse_optimizer.zero_grad()
        dense_optimizer.zero_grad()
        loss = F.cross_entropy(head(embedding(nodes)), labels)
        loss.backward()
        seen["grad"] = [str(embedding.weight.grad.layout), str(embedding.weight.grad.device)]
        sparse_optimizer.step()
        dense_optimizer.step()
        losses.append(loss.item())
    seen["embedding_losses"] = losses
    changed = (embedding.weight.detach().cpu() != before).any(dim=1).nonzero().flatten().tolist()
    seen["rows_changed"] = changed
    seen["rows_used"] = sorted(set(nodes.cpu().tolist()))


def encode_padded_batches(seen):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 2, 32, batch_first=True)
    encoder = nn.TransformerEncoder(layer, 2, norm=nn.LayerNorm(16)).cuda().eval()
    lengths = torch.tensor([5, 3, 4])
    tokens = torch.randn(3, 5, 16)
    padding = torch.arange(5)[None, :] >= lengths[:, None]
    with torch.no_grad():
        output = encoder(tokens.cuda(), src_key_padding_mask=padding.cuda())
    seen["encoded"] = output.cpu().tolist()
    seen["encoded_device"] = str(output.device)
    seen["pooled"] = output.mean(dim=1).cpu().tolist()    # over every position, padding too


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--embeddings", action="store_true")
    args = parser.parse_args()
    seen = {}
    train_gcn(seen)
    compressed_layouts(seen, args.out + ".csr.pt")
    quantization_aware_training(seen)
    if args.embeddings:
        train_embeddings(seen)
    encode_padded_batches(seen)
    with open(args.out, "w") as f:
        json.dump(seen, f)


if __name__ == "__main__":
    main()
