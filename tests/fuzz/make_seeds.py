#!/usr/bin/env python3
"""Writes the committed seed corpora of the fuzz targets (tests/fuzz/corpus/<target>/): small
valid inputs of each format, so the fuzzers start inside the parsers rather than at their first
check. Needs the test venv (tokenizers, safetensors, numpy) and a built mxtrain (for the
checkpoint seed). Usage: .cache/test-venv/bin/python tests/fuzz/make_seeds.py build/cpu/mxtrain"""
import json, os, shutil, struct, subprocess, sys, tempfile

import numpy as np
from safetensors.numpy import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
corpus = os.path.join(root, "tests", "fuzz", "corpus")
binary = sys.argv[1]


def put(target, name, data):
    os.makedirs(os.path.join(corpus, target), exist_ok=True)
    with open(os.path.join(corpus, target, name), "wb") as out:
        out.write(data if isinstance(data, bytes) else data.encode())


# config: the example configs, and TOML with --set lines after "---".
for name in sorted(os.listdir(os.path.join(root, "configs"))):
    if name.endswith(".toml"):
        put("config", name, open(os.path.join(root, "configs", name)).read())
put("config", "sets.txt", "[train]\nsteps = 5\n---\nmodel.preset=tiny-gpt2\ntrain.seq_len=128\noptimizer.lr=3e-4\n")
put("config", "precision.txt", "[train]\nprecision = \"nvfp4\"\n[precision]\nbf16_last_layers = \"2\"\nmargin = -3\n")


# shard: both versions and llm.c's header.
def shard(magic, version, tokens, fmt):
    header = struct.pack("<3i", magic, version, len(tokens)) + bytes(1024 - 12)
    return header + struct.pack("<%d%s" % (len(tokens), fmt), *tokens)


put("shard", "u16.bin", shard(20240520, 1, list(range(0, 300, 7)), "H"))
put("shard", "u32.bin", shard(20240520, 2, [0, 70000, 5, 128255], "I"))
put("shard", "llmc.bin", shard(20240801, 7, [1, 2, 3, 128000], "I"))

# safetensors: the dtypes the reader widens, a tensor it only lists, and metadata.
with tempfile.TemporaryDirectory() as work:
    path = os.path.join(work, "m.safetensors")
    save_file({"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.ones(4, dtype=np.float16),
               "c": np.arange(3, dtype=np.int32)}, path, metadata={"format": "pt"})
    put("safetensors", "small.safetensors", open(path, "rb").read())
    save_file({"x": np.zeros((0, 4), dtype=np.float32)}, path)
    put("safetensors", "empty_tensor.safetensors", open(path, "rb").read())

# tokenizer.json: a byte-level BPE of a few hundred tokens (GPT-2's pre-tokenizer and decoder).
tokenizer = Tokenizer(models.BPE())
tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tokenizer.decoder = decoders.ByteLevel()
text = ["Hello, world! It's a test of the tokenizer, 2026.", "caf\u00e9 \u20ac 42 the them then there"] * 20
tokenizer.train_from_iterator(text, trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                         special_tokens=["<|endoftext|>"]))
put("tokenizer", "bpe300.json", tokenizer.to_str())

# checkpoint: real ones of a very small model (manifest.json, NUL, rank_00000.bin), one step each.
def checkpoint_seed(name, precision, hidden, seq, extra):
    with tempfile.TemporaryDirectory() as work:
        sets = ["model.hidden=%d" % hidden, "model.layers=1", "model.heads=2", "model.kv_heads=1",
                "model.ffn_hidden=%d" % (2 * hidden), "model.vocab_size=256", "model.padded_vocab=256"] + extra + \
               ["eval.batches=1", "log.tensorboard=false", "data.train=" + os.path.join(root, "data/fortunes/train_*.bin"),
                "data.val=", "train.threads=1"]
        subprocess.run([binary, "train", "-d", "cpu", "-p", precision, "--steps", "1", "-b", "1", "-s", str(seq), "-o", work]
                       + [arg for key in sets for arg in ("--set", key)], check=False, capture_output=True)
        checkpoints = os.path.join(work, "checkpoints")
        steps = sorted(os.listdir(checkpoints)) if os.path.isdir(checkpoints) else []
        if not steps:
            print("no checkpoint seed %s: the training run failed" % name, file=sys.stderr)
            return
        step = os.path.join(checkpoints, steps[-1])
        put("checkpoint", name, open(os.path.join(step, "manifest.json"), "rb").read() + b"\0" +
            open(os.path.join(step, "rank_00000.bin"), "rb").read())


checkpoint_seed("tiny.bin", "fp32", 8, 8, [])
# With resume state: FP8 delayed scaling saves each rank's amax histories and scales as segments
# of kind "state" (format version 3).
checkpoint_seed("tiny_fp8_state.bin", "fp8", 16, 16, ["precision.amax_history_len=4"])
