"""A recurrent language model written for CUDA, as PyTorch's word-language-model example
writes one: nn.LSTM or nn.GRU over an embedding, hidden states detached between batches,
gradient clipping, then an LSTMCell/GRUCell decoder stepped by hand. Writes its losses as
JSON (argv[1])."""

import json
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
VOCAB, EMBED, HIDDEN, BPTT, BATCH = 32, 16, 24, 6, 4


class RNNModel(nn.Module):
    def __init__(self, rnn_type):
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, EMBED)
        self.rnn = getattr(nn, rnn_type)(EMBED, HIDDEN, num_layers=2, dropout=0.0)
        self.decoder = nn.Linear(HIDDEN, VOCAB)
        self.rnn_type = rnn_type

    def forward(self, tokens, hidden):
        output, hidden = self.rnn(self.encoder(tokens), hidden)
        return self.decoder(output), hidden

    def init_hidden(self, batch):
        weight = next(self.parameters())
        if self.rnn_type == "LSTM":
            return (weight.new_zeros(2, batch, HIDDEN), weight.new_zeros(2, batch, HIDDEN))
        return weight.new_zeros(2, batch, HIDDEN)


def repackage_hidden(h):
    return h.detach() if isinstance(h, torch.Tensor) else tuple(repackage_hidden(v) for v in h)


data = torch.randint(0, VOCAB, (BPTT * 5 + 1, BATCH)).to(device)
losses = {}
for rnn_type in ("LSTM", "GRU"):
    model = RNNModel(rnn_type).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    hidden = model.init_hidden(BATCH)
    losses[rnn_type] = []
    for epoch in range(2):
        for i in range(0, data.size(0) - 1, BPTT):
            inputs, targets = data[i:i + BPTT], data[i + 1:i + 1 + BPTT]
            hidden = repackage_hidden(hidden)
            model.zero_grad()
            output, hidden = model(inputs, hidden)
            loss = F.cross_entropy(output.view(-1, VOCAB), targets.reshape(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 0.25)
            optimizer.step()
            losses[rnn_type].append(loss.item())
    assert output.is_cuda and hidden[0].is_cuda

# A decoder stepped cell by cell.
for cell_type in ("LSTMCell", "GRUCell"):
    cell = getattr(nn, cell_type)(EMBED, HIDDEN).cuda()
    head = nn.Linear(HIDDEN, VOCAB).cuda()
    embed = nn.Embedding(VOCAB, EMBED).cuda()
    optimizer = torch.optim.Adam([*cell.parameters(), *head.parameters(), *embed.parameters()], lr=1e-2)
    losses[cell_type] = []
    for step in range(3):
        state = None
        loss = 0.0
        for t in range(BPTT):
            state = cell(embed(data[t]), state)
            loss = loss + F.cross_entropy(head(state[0] if cell_type == "LSTMCell" else state), data[t + 1])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses[cell_type].append(loss.item())

with open(sys.argv[1], "w") as f:
    json.dump(losses, f)
