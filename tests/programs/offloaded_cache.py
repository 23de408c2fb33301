"""Generation with Hugging Face's offloaded KV cache, as a memory-bound inference script runs it.

A small causal LM on "cuda" generates greedily twice from the same prompts: with the default
cache, and with ``cache_implementation="offloaded"``, which moves each layer's keys and values
to the host after the layer ran (``.to("cpu", non_blocking=True)``) and prefetches the next
layer's back on a side stream. Offloading must change where the cache lives, never what the
model generates. Writes the tokens of both runs as JSON to the path given.
"""

import json
import sys

import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
model = LlamaForCausalLM(config).cuda().eval()
prompts = torch.randint(3, 128, (2, 6), generator=torch.Generator().manual_seed(1)).cuda()


def generate(**cache):
    settings = GenerationConfig(max_new_tokens=10, do_sample=False, pad_token_id=0, **cache)
    with torch.no_grad():
        out = model.generate(prompts, attention_mask=torch.ones_like(prompts), generation_config=settings)
    torch.cuda.synchronize()
    return out[:, prompts.shape[1]:].tolist()


seen = {"default": generate(), "offloaded": generate(cache_implementation="offloaded"),
        "on_device": str(prompts.device.type)}
with open(sys.argv[1], "w") as f:
    json.dump(seen, f)
