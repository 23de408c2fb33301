"""A small Llama-style decoder trained with Liger's Triton kernels, as the LLM trainers that
adopt Liger write it, against the same model on torch's ops.

python liger_transformer.py OUT.json [--bf16]

Liger's RMSNorm, SwiGLU MLP, rotary embedding and fused linear cross-entropy replace their torch
twins; both models start from the same weights, take the same batches and train three AdamW
steps. OUT.json gets each model's losses, the largest weight difference after training, and
the device the weights are on.
"""

import argparse
import json
import types

import torch
import torch.nn as nn
import torch.nn.functional as F
from liger_kernel.transformers.fused_linear_cross_entropy import LigerFusedLinearCrossEntropyLoss
from liger_kernel.transformers.rms_norm import LigerRMSNorm
from liger_kernel.transformers.rope import liger_rotary_pos_emb
from liger_kernel.transformers.swiglu import LigerSwiGLUMLP

CONFIG = types.SimpleNamespace(vocab_size=96, hidden_size=32, intermediate_size=64, heads=4,
                               layers=2, hidden_act="silu", eps=1e-6)
BATCH, SEQUENCE, STEPS = 2, 12, 3


class RMSNorm(nn.Module):
    def __init__(self, size, eps):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x):
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return self.weight * (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype)


class SwiGLU(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


def rotate_half(x):
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def rotary(q, k, cos, sin):
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin


class Block(nn.Module):
    def __init__(self, config, liger):
        super().__init__()
        self.heads = config.heads
        self.head_dim = config.hidden_size // config.heads
        norm = (lambda: LigerRMSNorm(config.hidden_size, eps=config.eps)) if liger else \
            (lambda: RMSNorm(config.hidden_size, config.eps))
        self.attention_norm, self.mlp_norm = norm(), norm()
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size, bias=False)
        self.out = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.mlp = LigerSwiGLUMLP(config) if liger else SwiGLU(config)
        self.rope = liger_rotary_pos_emb if liger else rotary

    def forward(self, x, cos, sin):
        batch, length, width = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).split(width, dim=-1)
        q, k, v = (t.view(batch, length, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = self.rope(q, k, cos, sin)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.out(attended.transpose(1, 2).reshape(batch, length, width))
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    def __init__(self, config, liger):
        super().__init__()
        self.embed = nn.Embedding(config.vocab_size, config.hidden_size)
        self.blocks = nn.ModuleList(Block(config, liger) for _ in range(config.layers))
        self.norm = LigerRMSNorm(config.hidden_size, eps=config.eps) if liger else \
            RMSNorm(config.hidden_size, config.eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.liger = liger
        self.fused_loss = LigerFusedLinearCrossEntropyLoss() if liger else None
        head_dim = config.hidden_size // config.heads
        inverse = 1.0 / (10000 ** (torch.arange(0, head_dim, 2).float() / head_dim))
        angles = torch.outer(torch.arange(SEQUENCE).float(), inverse)
        self.register_buffer("cos", torch.cat((angles, angles), dim=-1).cos()[None], persistent=False)
        self.register_buffer("sin", torch.cat((angles, angles), dim=-1).sin()[None], persistent=False)

    def forward(self, tokens, labels):
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, self.cos, self.sin)
        hidden = self.norm(x)[:, :-1].reshape(-1, x.shape[-1])
        targets = labels[:, 1:].reshape(-1)
        if self.liger:
            return self.fused_loss(self.lm_head.weight, hidden, targets)
        return F.cross_entropy(self.lm_head(hidden).float(), targets)


def train(model, batches, dtype):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for tokens in batches:
        with torch.autocast("cuda", dtype=dtype, enabled=dtype != torch.float32):
            loss = model(tokens, tokens)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--bf16", action="store_true", help="train under bfloat16 autocast")
    args = parser.parse_args()
    dtype = torch.bfloat16 if args.bf16 else torch.float32

    torch.manual_seed(0)
    liger = Decoder(CONFIG, liger=True).cuda()
    reference = Decoder(CONFIG, liger=False).cuda()
    reference.load_state_dict(liger.state_dict())
    batches = [torch.randint(0, CONFIG.vocab_size, (BATCH, SEQUENCE)).cuda() for _ in range(STEPS)]

    liger_losses = train(liger, batches, dtype)
    reference_losses = train(reference, batches, dtype)
    weights = liger.state_dict()
    drift = max((weights[name].float() - value.float()).abs().max().item()
                for name, value in reference.state_dict().items())
    with open(args.out, "w") as out:
        json.dump({"liger": liger_losses, "reference": reference_losses, "weight_difference": drift,
                   "device": str(liger.lm_head.weight.device)}, out)


if __name__ == "__main__":
    main()
