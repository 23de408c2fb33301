"""A Llama model from transformers generating greedily on "cuda", once with the "sdpa"
attention and once with "flash_attention_2" (the flash_attn stand-in where the real
package cannot run), each moved with ``.cuda()``, then loaded straight onto the GPU as
inference scripts load it (``device_map="cuda"``: transformers then kernelizes it with the
Hub's kernels for the device's type). Saves the random model to argv[1]; prints the tokens as
JSON."""

import json
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM

config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
torch.manual_seed(0)
LlamaForCausalLM(config).save_pretrained(sys.argv[1])
tokens = {}
for implementation in ("sdpa", "flash_attention_2"):
    model = LlamaForCausalLM.from_pretrained(sys.argv[1], attn_implementation=implementation,
                                             dtype=torch.float32).cuda()
    prompt = torch.tensor([[1, 5, 9, 13, 2, 7]], device="cuda")
    out = model.generate(prompt, max_new_tokens=12, do_sample=False)
    tokens[implementation] = out[0].tolist()
    print(implementation, model.config._attn_implementation)
model = LlamaForCausalLM.from_pretrained(sys.argv[1], dtype=torch.float32, device_map="cuda")
prompt = torch.tensor([[1, 5, 9, 13, 2, 7]], device="cuda")
tokens["device_map"] = model.generate(prompt, max_new_tokens=12, do_sample=False)[0].tolist()
print(json.dumps(tokens))
