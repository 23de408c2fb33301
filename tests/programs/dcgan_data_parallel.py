"""In the style of PyTorch's DCGAN example: --ngpu N, and each network's forward runs
nn.parallel.data_parallel(self.main, input, range(self.ngpu)) on CUDA inputs. Tiny images,
random "real" data, a few steps; writes the losses to argv[1]."""

import argparse
import json

import torch
import torch.nn as nn
import torch.optim as optim

parser = argparse.ArgumentParser()
parser.add_argument("losses")
parser.add_argument("--ngpu", type=int, default=1, help="number of GPUs to use")
parser.add_argument("--niter", type=int, default=3)
parser.add_argument("--batchSize", type=int, default=8)
opt = parser.parse_args()

ngpu, nz, ngf, ndf, nc = opt.ngpu, 8, 4, 4, 3
device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
torch.manual_seed(7)


def weights_init(m):
    classname = m.__class__.__name__
    if classname.find("Conv") != -1:
        torch.nn.init.normal_(m.weight, 0.0, 0.02)
    elif classname.find("BatchNorm") != -1:
        torch.nn.init.normal_(m.weight, 1.0, 0.02)
        torch.nn.init.zeros_(m.bias)


class Generator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 4, ngf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ngf * 2), nn.ReLU(True),
            nn.ConvTranspose2d(ngf * 2, nc, 4, 2, 1, bias=False), nn.Tanh())

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output


class Discriminator(nn.Module):
    def __init__(self, ngpu):
        super().__init__()
        self.ngpu = ngpu
        self.main = nn.Sequential(
            nn.Conv2d(nc, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf, ndf * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ndf * 2), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(ndf * 2, 1, 4, 1, 0, bias=False), nn.Sigmoid())

    def forward(self, input):
        if input.is_cuda and self.ngpu > 1:
            output = nn.parallel.data_parallel(self.main, input, range(self.ngpu))
        else:
            output = self.main(input)
        return output.view(-1, 1).squeeze(1)


# Initialized before the move, so that every target starts from the same weights.
netG, netD = Generator(ngpu).apply(weights_init).to(device), Discriminator(ngpu).apply(weights_init).to(device)
criterion = nn.BCELoss()
fixed_noise = torch.randn(opt.batchSize, nz, 1, 1).to(device)    # the same numbers on every target
real_label, fake_label = 1., 0.
optimizerD = optim.Adam(netD.parameters(), lr=0.0002, betas=(0.5, 0.999))
optimizerG = optim.Adam(netG.parameters(), lr=0.0002, betas=(0.5, 0.999))

losses = []
for i in range(opt.niter):
    real_cpu = torch.rand(opt.batchSize, nc, 16, 16) * 2 - 1
    netD.zero_grad()
    real = real_cpu.to(device)
    label = torch.full((opt.batchSize,), real_label, dtype=real.dtype, device=device)
    errD_real = criterion(netD(real), label)
    errD_real.backward()
    noise = torch.randn(opt.batchSize, nz, 1, 1).to(device)
    fake = netG(noise)
    label.fill_(fake_label)
    errD_fake = criterion(netD(fake.detach()), label)
    errD_fake.backward()
    optimizerD.step()
    netG.zero_grad()
    label.fill_(real_label)
    errG = criterion(netD(fake), label)
    errG.backward()
    optimizerG.step()
    print(f"[{i}/{opt.niter}] Loss_D: {(errD_real + errD_fake).item():.4f} Loss_G: {errG.item():.4f}")
    losses.append([(errD_real + errD_fake).item(), errG.item()])

json.dump({"losses": losses, "fixed_sample_mean": netG(fixed_noise).mean().item()}, open(opt.losses, "w"))
