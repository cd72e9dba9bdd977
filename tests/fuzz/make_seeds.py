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

# checkpoint: a real one of a very small model: manifest.json, NUL, rank_00000.bin.
with tempfile.TemporaryDirectory() as work:
    subprocess.run([binary, "train", "-d", "cpu", "-p", "fp32", "--steps", "1", "-b", "1", "-s", "8", "-o", work,
                    "--set", "model.hidden=8", "--set", "model.layers=1", "--set", "model.heads=2",
                    "--set", "model.kv_heads=1", "--set", "model.ffn_hidden=16", "--set", "model.vocab_size=256",
                    "--set", "model.padded_vocab=256", "--set", "eval.batches=1", "--set", "log.tensorboard=false",
                    "--set", "data.train=" + os.path.join(root, "data/fortunes/train_*.bin"),
                    "--set", "data.val=", "--set", "train.threads=1"], check=False, capture_output=True)
    steps = sorted(os.listdir(os.path.join(work, "checkpoints"))) if os.path.isdir(os.path.join(work, "checkpoints")) else []
    if steps:
        step = os.path.join(work, "checkpoints", steps[-1])
        put("checkpoint", "tiny.bin", open(os.path.join(step, "manifest.json"), "rb").read() + b"\0" +
            open(os.path.join(step, "rank_00000.bin"), "rb").read())
    else:
        print("no checkpoint seed: the training run failed", file=sys.stderr)

# checkpoint with resume state: FP8 delayed scaling saves each rank's amax histories and scales
# as segments of kind "state" (format version 3).
with tempfile.TemporaryDirectory() as work:
    subprocess.run([binary, "train", "-d", "cpu", "-p", "fp8", "--steps", "1", "-b", "1", "-s", "16", "-o", work,
                    "--set", "model.hidden=16", "--set", "model.layers=1", "--set", "model.heads=2",
                    "--set", "model.kv_heads=1", "--set", "model.ffn_hidden=32", "--set", "model.vocab_size=256",
                    "--set", "model.padded_vocab=256", "--set", "precision.amax_history_len=4",
                    "--set", "eval.batches=1", "--set", "log.tensorboard=false",
                    "--set", "data.train=" + os.path.join(root, "data/fortunes/train_*.bin"),
                    "--set", "data.val=", "--set", "train.threads=1"], check=False, capture_output=True)
    steps = sorted(os.listdir(os.path.join(work, "checkpoints"))) if os.path.isdir(os.path.join(work, "checkpoints")) else []
    if steps:
        step = os.path.join(work, "checkpoints", steps[-1])
        put("checkpoint", "tiny_fp8_state.bin", open(os.path.join(step, "manifest.json"), "rb").read() + b"\0" +
            open(os.path.join(step, "rank_00000.bin"), "rb").read())
    else:
        print("no FP8 checkpoint seed: the training run failed", file=sys.stderr)
