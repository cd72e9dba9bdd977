"""The README's "Continue-train a Hugging Face model" walkthrough, run as written on a model
directory made by transformers' save_pretrained (tests/reference/hf/llama_gqa_untied) with a
TinyLlama-style sentencepiece tokenizer.model trained here (PyPI sentencepiece) and JSON lines of
the fortunes corpus. The commands are read from the README's code block, so a change there is
tested; only sizes shrink for a CPU (-b 8 -s 2048 -> -b 2 -s 64, --steps 1000 -> --steps 6, the
default device) and the paths point into a scratch directory. Then the export must hold what
transformers loads (config.json, generation_config.json, model.safetensors with the original's
tensor names and shapes, the tokenizer file), and `mxtrain generate` must continue a prompt from it.

Usage: readme_walkthrough.py MXTRAIN README.md FIXTURE_DIR WORKDIR
"""
import glob
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import sentencepiece as spm
from safetensors import safe_open

mxtrain, readme, fixture, workdir = sys.argv[1:5]
shutil.rmtree(workdir, ignore_errors=True)
os.makedirs(workdir)

text = open(readme, encoding="utf-8").read()
section = text.split("### Continue-train a Hugging Face model", 1)[1]
block = re.search(r"```sh\n(.*?)```", section, re.S).group(1)
# Join continuation lines, drop comments.
commands = [re.sub(r"\s+#.*$", "", line).strip() for line in block.replace("\\\n", " ").splitlines()]
commands = [c for c in commands if c]
verbs = [shlex.split(c)[1] for c in commands]
if verbs != ["prepare", "plan", "train", "export"]:
    sys.exit("the walkthrough's commands changed (%s): update this test with it" % verbs)

# The user's model directory and text.
model_dir = os.path.join(workdir, "models", "TinyLlama")
shutil.copytree(fixture, model_dir)
os.remove(os.path.join(model_dir, "expected.json"))  # the fixture's own check values, not a model file
documents = []
for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if path.endswith(".dat") or os.path.isdir(path):
        continue
    with open(path, encoding="utf-8", errors="ignore") as f:
        documents += [d.strip() for d in f.read().split("\n%\n") if d.strip()]
if len(documents) < 1000:
    sys.exit("the fortunes corpus is missing: scripts/setup.sh installs the Debian package fortunes")
documents = documents[:3000]
train_text = os.path.join(workdir, "spm_train.txt")
with open(train_text, "w", encoding="utf-8") as f:
    f.write("\n".join(documents))
vocab = json.load(open(os.path.join(model_dir, "config.json")))["vocab_size"]
spm.SentencePieceTrainer.train(input=train_text, model_prefix=os.path.join(workdir, "spm"), vocab_size=vocab - 50,
                               model_type="bpe", character_coverage=1.0, minloglevel=2)
shutil.copy(os.path.join(workdir, "spm.model"), os.path.join(model_dir, "tokenizer.model"))
with open(os.path.join(workdir, "my-text.jsonl"), "w", encoding="utf-8") as f:
    for d in documents:
        f.write(json.dumps({"text": d}) + "\n")


def shrink(command):
    command = command.replace("-b 8 -s 2048", "-b 2 -s 64").replace("--steps 1000", "--steps 6")
    args = shlex.split(command)
    assert args[0] == "mxtrain", command
    return [mxtrain] + args[1:]


for command in commands:
    args = shrink(command)
    print("$", " ".join(shlex.quote(a) for a in args), flush=True)
    result = subprocess.run(args, cwd=workdir, capture_output=True, text=True)
    print(result.stdout[-1500:], result.stderr[-1500:], flush=True)
    if result.returncode != 0:
        sys.exit("the README's command failed (exit %d): %s" % (result.returncode, command))

exported = os.path.join(workdir, "exported", "mine")
for name in ["config.json", "generation_config.json", "model.safetensors", "tokenizer.model"]:
    if not os.path.exists(os.path.join(exported, name)):
        sys.exit("the export lacks %s (it has %s)" % (name, sorted(os.listdir(exported))))


def shapes(path):
    # Names, shapes and dtypes through the reference reader (numpy has no bfloat16 to load into).
    with safe_open(path, framework="np") as f:
        return {name: (tuple(f.get_slice(name).get_shape()), f.get_slice(name).get_dtype()) for name in f.keys()}


original = shapes(os.path.join(model_dir, "model.safetensors"))
trained = shapes(os.path.join(exported, "model.safetensors"))
if sorted(original) != sorted(trained):
    sys.exit("tensor names differ: %s" % sorted(set(original) ^ set(trained)))
for name, (shape, _) in original.items():
    if shape != trained[name][0] or trained[name][1] != "BF16":
        sys.exit("%s: shape %s exported as %s" % (name, shape, trained[name]))
config = json.load(open(os.path.join(exported, "config.json")))
if config["vocab_size"] != vocab or config["architectures"] != ["LlamaForCausalLM"]:
    sys.exit("config.json: %s" % config)
result = subprocess.run([mxtrain, "generate", exported, "--prompt", "The ", "--max-tokens", "16", "--seed", "1"],
                        cwd=workdir, capture_output=True, text=True)
if result.returncode != 0 or not result.stdout.startswith("The "):
    sys.exit("generate from the export failed: %s %s" % (result.stdout, result.stderr[-800:]))
print("walkthrough ok: %d commands, %d tensors exported, sample %r" % (len(commands), len(trained), result.stdout[:60]))
