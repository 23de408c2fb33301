"""QLoRA as PEFT's and transformers' guides write it for a CUDA GPU: a causal LM loaded in 8-bit
or 4-bit (nf4) through BitsAndBytesConfig with device_map={"": 0}, prepared for k-bit training,
LoRA adapters trained with AdamW on "cuda", then greedy generation. The base model is a tiny
Llama made here (no download). Prints one JSON line: the quantized weight's dtype, the
device the model reports, the losses, whether the adapters moved, and the generated tokens."""

import argparse
import json

import torch
from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
from transformers import AutoModelForCausalLM, BitsAndBytesConfig, LlamaConfig, LlamaForCausalLM

parser = argparse.ArgumentParser()
parser.add_argument("folder")
parser.add_argument("--bits", type=int, choices=(4, 8), default=4)
parser.add_argument("--steps", type=int, default=6)
parser.add_argument("--new-tokens", type=int, default=6)
args = parser.parse_args()

torch.manual_seed(0)
config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64)
LlamaForCausalLM(config).save_pretrained(args.folder)

if args.bits == 8:
    quantization = BitsAndBytesConfig(load_in_8bit=True)
else:
    quantization = BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                      bnb_4bit_use_double_quant=True,
                                      bnb_4bit_compute_dtype=torch.bfloat16)
model = AutoModelForCausalLM.from_pretrained(args.folder, quantization_config=quantization,
                                             device_map={"": 0})
weight_dtype = str(model.model.layers[0].self_attn.q_proj.weight.dtype)
model = prepare_model_for_kbit_training(model)
model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0,
                                         target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))
adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)

batch = torch.randint(0, 128, (2, 16)).to("cuda")
losses = []
for step in range(args.steps):
    loss = model(input_ids=batch, labels=batch).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())

moved = all(not torch.equal(p.detach(), adapters[n]) for n, p in model.named_parameters() if p.requires_grad)
with torch.no_grad():
    tokens = model.generate(input_ids=batch[:1, :4], attention_mask=torch.ones_like(batch[:1, :4]),
                            max_new_tokens=args.new_tokens, do_sample=False, pad_token_id=0)
print(json.dumps({"weight_dtype": weight_dtype, "device": str(model.device), "is_cuda": batch.is_cuda,
                  "losses": losses, "adapters_moved": moved, "tokens": tokens[0].tolist()}))
