"""The Hugging Face round trip on the GPU machine (torch and transformers are there), one command:
  1. mxtrain trains a Llama, a GPT-2 and two Llamas with biases (on q, k and v: exported as a
     Qwen2; on every linear) (byte vocabulary, the fortunes corpus) on the GPU, exports them, and
     `AutoModelForCausalLM.from_pretrained` computes the held-out loss on the same validation
     windows: it must equal mxtrain's final held-out loss to 1e-4 (relative);
  2. transformers makes a random Llama (GQA), Llama 3 (rope scaling), GPT-2, Qwen2, Llama with
     biases and Mistral (sliding window) and saves them; mxtrain trains each for 50 steps from it
     (--init-from), exports, and transformers' held-out loss of the export again equals mxtrain's
     to 1e-4.
Runs in FP32 (-p fp32) so the two engines compute the same function; prints one JSON line per
case and exits 1 if any differs. Usage:
  python3 tests/reference/hf_roundtrip_check.py MXTRAIN CORPUS_DIR WORKDIR"""
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import torch
import transformers
from transformers import (AutoModelForCausalLM, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM,
                          MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM)

mxtrain, corpus, work = sys.argv[1:4]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
SEQ, MICRO, EVAL_BATCHES = 128, 8, 4


def val_windows():
    """mxtrain's validation windows: window i = tokens [i*SEQ, i*SEQ + SEQ + 1) of the val shard."""
    raw = open(os.path.join(corpus, "val_000000.bin"), "rb").read()
    header = np.frombuffer(raw[:1024], dtype="<i4")
    dtype = "<u2" if header[1] == 1 else "<u4"
    tokens = np.frombuffer(raw[1024:], dtype=dtype)[: header[2]].astype(np.int64)
    n = MICRO * EVAL_BATCHES
    rows = np.stack([tokens[i * SEQ: i * SEQ + SEQ + 1] for i in range(n)])
    return torch.from_numpy(rows[:, :-1]), torch.from_numpy(rows[:, 1:])


def transformers_loss(directory):
    model = AutoModelForCausalLM.from_pretrained(directory, torch_dtype=torch.float32).cuda().eval()
    inputs, targets = val_windows()
    total, count = 0.0, 0
    with torch.no_grad():
        for b in range(0, inputs.shape[0], MICRO):
            logits = model(inputs[b:b + MICRO].cuda()).logits.float()
            total += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                       targets[b:b + MICRO].reshape(-1).cuda(),
                                                       reduction="sum").item()
            count += targets[b:b + MICRO].numel()
    return total / count


def train(run_dir, steps, *extra):
    command = [mxtrain, "train", "--steps", str(steps), "-b", str(MICRO), "-s", str(SEQ), "-p", "fp32", "-d", "cuda",
               "-o", run_dir, "--set", "data.train=%s/train_*.bin" % corpus, "--set", "data.val=%s/val_*.bin" % corpus,
               "--set", "eval.batches=%d" % EVAL_BATCHES, "--set", "eval.every=0", "--set", "log.every=25", *extra]
    run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit("train failed: %s\n%s" % (" ".join(command), run.stdout[-2000:] + run.stderr[-2000:]))
    losses = [json.loads(l)["val_loss"] for l in open(os.path.join(run_dir, "metrics.jsonl")) if "val_loss" in l]
    return losses[-1]


def export(run_dir, out_dir):
    run = subprocess.run([mxtrain, "export", run_dir, out_dir, "--dtype", "f32"], capture_output=True, text=True)
    if run.returncode != 0:
        raise SystemExit("export failed: " + run.stdout + run.stderr)


failures = 0


def check(case, mxtrain_loss, hf_loss):
    global failures
    relative = abs(mxtrain_loss - hf_loss) / abs(hf_loss)
    ok = relative <= 1e-4
    failures += not ok
    print(json.dumps({"case": case, "mxtrain_val_loss": mxtrain_loss, "transformers_val_loss": hf_loss,
                      "relative_difference": relative, "ok": ok, "transformers": transformers.__version__,
                      "torch": torch.__version__}), flush=True)


# 1. mxtrain-trained models out to transformers (the tiny Llama with biases on q, k and v is
#    exported as a Qwen2, with biases on every linear as a Llama with attention_bias and mlp_bias).
for name, args in (("tiny", ()), ("tiny-gpt2", ()), ("tiny-qkv-bias", ("--set", "model.qkv_bias=true")),
                   ("tiny-bias", ("--set", "model.bias=true"))):
    run_dir = os.path.join(work, "run_" + name)
    loss = train(run_dir, 200, "-m", name.replace("-qkv-bias", "").replace("-bias", ""), *args)
    export(run_dir, os.path.join(work, "export_" + name))
    check("trained %s, exported" % name, loss, transformers_loss(os.path.join(work, "export_" + name)))

# 2. transformers-made models in, trained 50 steps, out again.
torch.manual_seed(0)
made = {
    "llama_gqa": LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=352,
                                              num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                                              max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                                              tie_word_embeddings=False)),
    "llama3_rope_scaling": LlamaForCausalLM(LlamaConfig(
        vocab_size=256, hidden_size=128, intermediate_size=352, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=1, max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=500000.0,
        tie_word_embeddings=True, rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})),
    "gpt2": GPT2LMHeadModel(GPT2Config(vocab_size=256, n_embd=128, n_layer=3, n_head=4, n_positions=512,
                                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)),
    "qwen2": Qwen2ForCausalLM(Qwen2Config(vocab_size=256, hidden_size=128, intermediate_size=352,
                                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                          max_position_embeddings=512, rms_norm_eps=1e-6, rope_theta=1000000.0,
                                          tie_word_embeddings=True, use_sliding_window=False)),
    "llama_bias": LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=128, intermediate_size=352,
                                               num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                               max_position_embeddings=512, attention_bias=True, mlp_bias=True)),
    # The window is the training sequence: full causal attention is the window's exactly.
    "mistral": MistralForCausalLM(MistralConfig(vocab_size=256, hidden_size=128, intermediate_size=352,
                                                num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                                max_position_embeddings=512, sliding_window=SEQ)),
}
with torch.no_grad():  # transformers starts biases at zero: give them values, so the import reads them
    for name in ("qwen2", "llama_bias"):
        for parameter_name, parameter in made[name].named_parameters():
            if parameter_name.endswith("bias"):
                parameter.normal_(0.0, 0.05)
for name, model in made.items():
    source = os.path.join(work, "made_" + name)
    model.save_pretrained(source, safe_serialization=True)
    run_dir = os.path.join(work, "run_made_" + name)
    loss = train(run_dir, 50, "--init-from", source)
    export(run_dir, os.path.join(work, "export_made_" + name))
    check("%s made by transformers, 50 steps, exported" % name, loss,
          transformers_loss(os.path.join(work, "export_made_" + name)))
sys.exit(1 if failures else 0)
