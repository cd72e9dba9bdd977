"""Writes the Hugging Face import fixtures (tests/reference/hf/): tiny random-weight models saved
by `transformers` itself with save_pretrained, with the logits and loss transformers computes on
fixed tokens. mxtrain's import is checked against them on the CPU (no torch in CI). Run where
torch and transformers are installed (the GPU machine has both):
    python3 tests/reference/make_hf_fixtures.py tests/reference/hf [NAME ...]
(names: only those fixtures; the default is all of them).
Each model directory gets config.json, model.safetensors (or shards with an index) and
expected.json: {"transformers": version, "input": [B][T], "targets": [B][T], "logits": flat
float32 [B*T*V] of the input, "loss": mean cross-entropy of the targets}."""
import json
import os
import sys

import torch
import transformers
from transformers import (GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MistralConfig,
                          MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

out_dir = sys.argv[1]
only = set(sys.argv[2:])
os.makedirs(out_dir, exist_ok=True)
VOCAB = 250  # not a multiple of 64: the import pads it, the export slices it back


def llama(**extra):
    config = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                  rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, bos_token_id=1,
                  eos_token_id=2)
    config.update(extra)
    return LlamaForCausalLM(LlamaConfig(**config))


def qwen2():  # biases on q, k and v only; tied, as Qwen2.5-0.5B to 3B are; its window off
    return Qwen2ForCausalLM(Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                                        rms_norm_eps=1e-6, rope_theta=1000000.0, tie_word_embeddings=True,
                                        use_sliding_window=False, bos_token_id=1, eos_token_id=2))


def mistral():  # a window of 16: the 16 input tokens are exactly inside it (no query is 16 away)
    return MistralForCausalLM(MistralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=160,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                                            sliding_window=16, tie_word_embeddings=False, bos_token_id=1,
                                            eos_token_id=2))


def gpt2():
    config = GPT2Config(vocab_size=VOCAB, n_embd=64, n_layer=2, n_head=4, n_positions=128, resid_pdrop=0.0,
                        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(config)


models = {
    "llama_gqa_untied": lambda: llama(),
    "llama_gqa_tied": lambda: llama(tie_word_embeddings=True),
    "llama3_rope_scaling": lambda: llama(rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32}),
    "gpt2": gpt2,
    "qwen2": qwen2,
    "llama_bias": lambda: llama(attention_bias=True, mlp_bias=True),  # biases on every linear
    "mistral": mistral,
}
# The fixtures whose linear biases get values (those made before them keep transformers' zeros,
# GPT-2's among them, so re-running the script makes the committed files again).
BIASES_NONZERO = {"qwen2", "llama_bias"}
generator = torch.Generator().manual_seed(20261201)
tokens = torch.randint(0, VOCAB, (2, 17), generator=generator)
for index, (name, make) in enumerate(models.items()):
    if only and name not in only:
        continue
    torch.manual_seed(1000 + index)
    model = make().float().eval()
    with torch.no_grad():  # larger than the default init, so the logits are far from uniform
        for parameter_name, parameter in model.named_parameters():
            if parameter.dim() > 1:
                parameter.normal_(0.0, 0.08)
            elif parameter_name.endswith("bias") and name in BIASES_NONZERO:
                parameter.normal_(0.0, 0.08)  # transformers starts biases at zero: these are read
    directory = os.path.join(out_dir, name)
    # One model is saved in shards, to cover model.safetensors.index.json.
    model.save_pretrained(directory, safe_serialization=True, max_shard_size="100KB" if name == "gpt2" else "50MB")
    with torch.no_grad():
        output = model(tokens[:, :-1], labels=None)
        logits = output.logits.float()
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
    expected = {"transformers": transformers.__version__, "torch": torch.__version__,
                "input": tokens[:, :-1].tolist(), "targets": tokens[:, 1:].tolist(),
                "logits": [round(float(x), 7) for x in logits.reshape(-1)], "loss": float(loss)}
    with open(os.path.join(directory, "expected.json"), "w") as f:
        json.dump(expected, f)
    print("%s: loss %.6f, files %s" % (name, float(loss), sorted(os.listdir(directory))))
