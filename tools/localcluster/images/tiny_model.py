"""The local hub's real model (tools/localcluster/images/vllm.ts): a Llama-shaped causal language
model that vLLM loads and answers with, made here with transformers and nothing from outside.
Hidden 256 in 4 heads of 64 (vLLM's CPU attention refuses a head size of 16), 2 of them for keys
and values, 2 layers, bf16 weights from a fixed seed; a byte-level BPE tokenizer trained on a few
lines; a one-line chat template. The same script and packages give the same bytes."""
import json, os, sys
import torch
from tokenizers import Tokenizer, models, pre_tokenizers, decoders, trainers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = sys.argv[1]
os.makedirs(out, exist_ok=True)
text = [
    "Warmstart makes model servers start warm.",
    "One download per cluster, then every replica starts from the cache.",
    "The quick brown fox jumps over the lazy dog.",
    "Hello, how are you today? I am fine, thank you.",
] * 50
tok = Tokenizer(models.BPE(unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<unk>", "<s>", "</s>"],
                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
tok.train_from_iterator(text, trainer)
fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
fast.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
fast.save_pretrained(out)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=len(fast), hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, torch_dtype="bfloat16")
model = LlamaForCausalLM(cfg).to(torch.bfloat16)
model.save_pretrained(out, safe_serialization=True)
print(json.dumps(sorted(os.listdir(out))))
