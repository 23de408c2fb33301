"""In the style of PyTorch's data parallelism tutorial, trained for a few steps.

The model goes into nn.DataParallel when torch.cuda.device_count() > 1 and onto cuda:0;
batches come from a DataLoader. Writes the losses and the batch sizes the model saw to argv[1].
"""

import json
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset

input_size, output_size = 5, 2
batch_size, data_size = 30, 100
device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


class RandomDataset(Dataset):
    def __init__(self, size, length):
        self.len = length
        self.data = torch.randn(length, size)

    def __getitem__(self, index):
        return self.data[index]

    def __len__(self):
        return self.len


rand_loader = DataLoader(dataset=RandomDataset(input_size, data_size), batch_size=batch_size,
                         shuffle=True)
seen_sizes = []


class Model(nn.Module):
    def __init__(self, input_size, output_size):
        super().__init__()
        self.fc = nn.Linear(input_size, output_size)

    def forward(self, input):
        output = self.fc(input)
        print("\tIn Model: input size", input.size(), "output size", output.size())
        seen_sizes.append(input.size(0))
        return output


model = Model(input_size, output_size)
if torch.cuda.device_count() > 1:
    print("Let's use", torch.cuda.device_count(), "GPUs!")
    model = nn.DataParallel(model)
model.to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

losses = []
for epoch in range(2):
    for data in rand_loader:
        input = data.to(device)
        output = model(input)
        print("Outside: input size", input.size(), "output_size", output.size())
        loss = (output - 1).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())

json.dump({"losses": losses, "sizes": sorted(seen_sizes), "wrapped": isinstance(model, nn.DataParallel),
           "output_on": str(output.device)}, open(sys.argv[1], "w"))
