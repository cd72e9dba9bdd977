"""mxtrain's tokenizers against the reference packages, on the fortunes corpus (Debian package
`fortunes`): a byte-level BPE trained here with PyPI `tokenizers` (GPT-2's pre-tokenizer, a
Llama-3-style Split + ByteLevel sequence with special tokens, and Qwen2's: the same with an NFC
normalizer), and a sentencepiece BPE with byte fallback trained here with PyPI `sentencepiece`.
mxtrain's ids must equal the reference's on every document, and decode(encode(doc)) == doc (its
NFC form under the NFC normalizer). Damaged tokenizer files must be refused with a
message (exit 1), never a crash.

Usage: tokenizer_reference.py TOOL WORKDIR"""
import glob
import json
import os
import random
import subprocess
import sys
import unicodedata

import sentencepiece as spm
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

tool, workdir = sys.argv[1], sys.argv[2]
os.makedirs(workdir, exist_ok=True)

documents = []
for path in sorted(glob.glob("/usr/share/games/fortunes/*")):
    if path.endswith((".dat", ".u8")) or not os.path.isfile(path):
        continue
    with open(path, encoding="utf-8", errors="replace") as f:
        documents += [d for d in f.read().split("\n%\n") if d.strip()]
if len(documents) < 1000:
    sys.exit("the fortunes corpus is missing: scripts/setup.sh installs the Debian package fortunes")
# Text no corpus line has: other scripts, digits in runs, emoji, spaces at the ends, a special
# token inside a document.
# Then text that NFC changes: decomposed accents and Hangul, the Angstrom sign (a singleton),
# a combining mark after a special token, and a chat turn.
extra = ["Grüße aus Köln — 1234567 €, ½ × 3 ≥ 1.", "日本語のテキスト、そして中文。", "emoji 🙂🚀 ok",
         "   leading and trailing   ", "tabs\tand\r\nCRLF", "", "a<|endoftext|>b<|end_of_text|>c",
         "'s 're 've 'll 'd 'm 't DON'T",
         "Cafe\u0301 nai\u0308ve Gru\u0308\u00dfe A\u030angstro\u0308m", "\u1100\u1161\u11a8 \u1112\u1161\u11ab",
         "\u212b and \u2126 and e\u0301\u0323 and q\u0307\u0323", "<|im_start|>user\nhe\u0301llo<|im_end|>\u0301"]
documents += extra
docs_path = os.path.join(workdir, "documents.json")
with open(docs_path, "w") as f:
    json.dump(documents, f)
train_path = os.path.join(workdir, "train.txt")
with open(train_path, "w") as f:
    f.write("\n".join(documents[:-len(extra)]))

failures = []


def mxtrain_encode(tokenizer_path):
    run = subprocess.run([tool, tokenizer_path, docs_path], capture_output=True, text=True)
    if run.returncode != 0:
        failures.append("%s: exit %d: %s" % (tokenizer_path, run.returncode, run.stderr.strip()))
        return None
    return json.loads(run.stdout)


def compare(label, tokenizer_path, reference_ids, vocab_size, eos=None, nfc=False):
    got = mxtrain_encode(tokenizer_path)
    if got is None:
        return
    differing = [i for i, ids in enumerate(reference_ids) if got["ids"][i] != ids]
    if differing:
        i = differing[0]
        failures.append("%s: %d of %d documents differ; first %r: mxtrain %s, reference %s" % (
            label, len(differing), len(documents), documents[i][:60], got["ids"][i][:20], reference_ids[i][:20]))
    # Under NFC, decode(encode(doc)) is doc's NFC form: only documents NFC changes differ, to it.
    wrong = [i for i, text in zip(got["roundtrip_failures"], got["roundtrip_texts"])
             if not nfc or text != unicodedata.normalize("NFC", documents[i])]
    if wrong:
        failures.append("%s: decode(encode(doc)) != doc for %d documents (first %r)" % (
            label, len(wrong), documents[wrong[0]][:60]))
    if nfc and not got["roundtrip_failures"]:
        failures.append("%s: no document was changed by NFC: the normalizer did not run" % label)
    if got["vocab_size"] != vocab_size:
        failures.append("%s: vocab size %d, reference %d" % (label, got["vocab_size"], vocab_size))
    if eos is not None and got["eos"] != eos:
        failures.append("%s: eos %r, reference %r" % (label, got["eos"], eos))
    print("%s: %d documents, %d tokens, ids equal: %s" % (label, len(documents), sum(map(len, got["ids"])),
                                                           not differing))


# 1. GPT-2 style: ByteLevel pre-tokenizer (GPT-2's regex), <|endoftext|> special.
gpt2 = Tokenizer(models.BPE())
gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
gpt2.decoder = decoders.ByteLevel()
gpt2.train([train_path], trainers.BpeTrainer(vocab_size=2000, special_tokens=["<|endoftext|>"],
                                              initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
gpt2_path = os.path.join(workdir, "gpt2_tokenizer.json")
gpt2.save(gpt2_path)
compare("byte-level BPE (GPT-2 pre-tokenizer)", gpt2_path,
        [gpt2.encode(d, add_special_tokens=False).ids for d in documents], gpt2.get_vocab_size(),
        eos=gpt2.token_to_id("<|endoftext|>"))

# 2. Llama 3 style: Split(Llama 3's regex, Isolated) then ByteLevel without regex; ignore_merges.
llama3_pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
llama3 = Tokenizer(models.BPE(ignore_merges=True))
llama3.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(llama3_pattern), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
llama3.decoder = decoders.ByteLevel()
llama3.train([train_path], trainers.BpeTrainer(
    vocab_size=3000, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
llama3_dir = os.path.join(workdir, "llama3")
os.makedirs(llama3_dir, exist_ok=True)
llama3.save(os.path.join(llama3_dir, "tokenizer.json"))
with open(os.path.join(llama3_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|end_of_text|>"}}, f)
compare("byte-level BPE (Llama 3 pre-tokenizer, model directory)", llama3_dir,
        [llama3.encode(d, add_special_tokens=False).ids for d in documents], llama3.get_vocab_size(),
        eos=llama3.token_to_id("<|end_of_text|>"))

# 2b. Qwen2 style: an NFC normalizer, then Split(Qwen2's regex: digits one by one) and ByteLevel;
#     special tokens <|endoftext|> (EOS, no BOS), <|im_start|>, <|im_end|>.
qwen2_pattern = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
qwen2 = Tokenizer(models.BPE())
qwen2.normalizer = normalizers.NFC()
qwen2.pre_tokenizer = pre_tokenizers.Sequence([
    pre_tokenizers.Split(Regex(qwen2_pattern), behavior="isolated", invert=False),
    pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
qwen2.decoder = decoders.ByteLevel()
qwen2.train([train_path], trainers.BpeTrainer(
    vocab_size=3000, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
    initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
qwen2_dir = os.path.join(workdir, "qwen2")
os.makedirs(qwen2_dir, exist_ok=True)
qwen2.save(os.path.join(qwen2_dir, "tokenizer.json"))
with open(os.path.join(qwen2_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": None, "eos_token": "<|endoftext|>"}, f)
compare("byte-level BPE (Qwen2: NFC normalizer, model directory)", qwen2_dir,
        [qwen2.encode(d, add_special_tokens=False).ids for d in documents], qwen2.get_vocab_size(),
        eos=qwen2.token_to_id("<|endoftext|>"), nfc=True)

# 3. sentencepiece BPE with byte fallback (Llama 2 / TinyLlama style).
prefix = os.path.join(workdir, "spm")
spm.SentencePieceTrainer.train(input=train_path, model_prefix=prefix, vocab_size=1500, model_type="bpe",
                               byte_fallback=True, character_coverage=0.9995, max_sentence_length=100000,
                               minloglevel=2)
sp = spm.SentencePieceProcessor(model_file=prefix + ".model")
reference = [sp.encode(d) for d in documents]
# sentencepiece normalises (NFKC, whitespace), so decode(encode(doc)) == doc only holds for
# normalised text: compare the ids, and decode against the reference's own decode.
got = mxtrain_encode(prefix + ".model")
if got is not None:
    differing = [i for i, ids in enumerate(reference) if got["ids"][i] != ids]
    if differing:
        failures.append("sentencepiece: %d documents differ, first %r" % (len(differing), documents[differing[0]][:60]))
    expected_roundtrip = [i for i, d in enumerate(documents) if sp.decode(reference[i]) != d]
    if got["roundtrip_failures"] != expected_roundtrip:
        failures.append("sentencepiece: round-trip failures %s, reference %s" % (got["roundtrip_failures"][:10],
                                                                                 expected_roundtrip[:10]))
    if got["vocab_size"] != sp.get_piece_size() or got["eos"] != sp.eos_id() or got["bos"] != sp.bos_id():
        failures.append("sentencepiece: vocab/bos/eos %s/%s/%s, reference %s/%s/%s" % (
            got["vocab_size"], got["bos"], got["eos"], sp.get_piece_size(), sp.bos_id(), sp.eos_id()))
    print("sentencepiece BPE: %d documents, ids equal: %s" % (len(documents), not differing))

# 3b. A Llama 2 / TinyLlama model directory: tokenizer.model beside its conversion to
# tokenizer.json (the layout transformers writes: BPE with byte fallback, Prepend/Replace
# normalizer, no pre-tokenizer). The directory reads the sentencepiece original, with its ids.
llama2_dir = os.path.join(workdir, "llama2")
os.makedirs(llama2_dir, exist_ok=True)
with open(prefix + ".model", "rb") as source, open(os.path.join(llama2_dir, "tokenizer.model"), "wb") as target:
    target.write(source.read())
converted = {
    "version": "1.0", "added_tokens": [], "pre_tokenizer": None,
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
                                                       {"type": "Replace", "pattern": {"String": " "},
                                                        "content": "\u2581"}]},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
                                                 {"type": "ByteFallback"}, {"type": "Fuse"},
                                                 {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "dropout": None, "unk_token": "<unk>", "byte_fallback": True, "fuse_unk": True,
              "vocab": {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}, "merges": []}}
with open(os.path.join(llama2_dir, "tokenizer.json"), "w") as f:
    json.dump(converted, f)
got = mxtrain_encode(llama2_dir)
if got is not None:
    differing = [i for i, ids in enumerate(reference) if got["ids"][i] != ids]
    if differing or got["vocab_size"] != sp.get_piece_size():
        failures.append("Llama 2 style directory: %d documents differ, vocab %s" % (len(differing), got["vocab_size"]))
    print("Llama 2 style directory (tokenizer.model beside its tokenizer.json): ids equal: %s" % (not differing))
run = subprocess.run([tool, os.path.join(llama2_dir, "tokenizer.json"), docs_path], capture_output=True, text=True)
if run.returncode != 1 or "give the sentencepiece model beside it" not in run.stderr:
    failures.append("a converted tokenizer.json given alone: exit %d, %r" % (run.returncode, run.stderr[:300]))

# 4. Damaged tokenizer files: refused with a message, never a crash.
text = open(gpt2_path).read()
rng = random.Random(7)
broken = {"truncated": text[: len(text) // 2], "not json": "{]", "empty": "",
          "wordpiece": text.replace('"type": "BPE"', '"type": "WordPiece"', 1),
          "normalizer": text.replace('"normalizer": null', '"normalizer": {"type": "Lowercase"}', 1),
          "missing merge symbol": text.replace('"merges": [', '"merges": [["zzqx", "qq"], ', 1)}
for i in range(40):
    chars = list(text)
    for _ in range(5):
        chars[rng.randrange(len(chars))] = rng.choice('{}[]",:0a\\')
    broken["random edit %d" % i] = "".join(chars)
for label, content in broken.items():
    path = os.path.join(workdir, "broken.json")
    with open(path, "w") as f:
        f.write(content)
    run = subprocess.run([tool, path, docs_path], capture_output=True, text=True)
    if run.returncode not in (0, 1) or (run.returncode == 1 and "tokenizer" not in run.stderr):
        failures.append("broken tokenizer (%s): exit %d, %r" % (label, run.returncode, run.stderr[:200]))
    if label in ("truncated", "not json", "empty", "wordpiece", "normalizer", "missing merge symbol") and \
            run.returncode != 1:
        failures.append("broken tokenizer (%s) was accepted" % label)
for content, label in ((b"\x00garbage" * 10, "garbage .model"),):
    path = os.path.join(workdir, "broken.model")
    with open(path, "wb") as f:
        f.write(content)
    run = subprocess.run([tool, path, docs_path], capture_output=True, text=True)
    if run.returncode != 1:
        failures.append("%s: exit %d" % (label, run.returncode))

for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)
