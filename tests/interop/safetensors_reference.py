"""mxtrain's safetensors reader and writer against the reference implementation (PyPI
`safetensors`): files the reference writes read back value for value, files mxtrain writes
load in the reference byte for byte, and a file the reference refuses mxtrain refuses too.

Usage: safetensors_reference.py TOOL WORKDIR (TOOL is tests/interop/safetensors_tool)."""
import ctypes
import json
import math
import os
import random
import struct
import subprocess
import sys

import safetensors

tool, workdir = sys.argv[1], sys.argv[2]
os.makedirs(workdir, exist_ok=True)
rng = random.Random(20261201)


def f32_bytes(values):
    return struct.pack("<%df" % len(values), *values)


def bf16_bits(value):  # round to nearest even, as torch does
    bits = struct.unpack("<I", struct.pack("<f", value))[0]
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) & 0xFFFF


def tensor(dtype, shape):
    count = math.prod(shape)
    values = [rng.uniform(-3, 3) for _ in range(count)]
    if dtype == "F32":
        data = f32_bytes(values)
        expect = list(struct.unpack("<%df" % count, data))
    elif dtype == "BF16":
        words = [bf16_bits(v) for v in values]
        data = struct.pack("<%dH" % count, *words)
        expect = [struct.unpack("<f", struct.pack("<I", w << 16))[0] for w in words]
    elif dtype == "F16":
        data = struct.pack("<%de" % count, *values)
        expect = list(struct.unpack("<%de" % count, data))
    else:  # I32
        data = struct.pack("<%di" % count, *[rng.randrange(-1000, 1000) for _ in range(count)])
        expect = None
    return {"dtype": dtype, "shape": shape, "data": data}, expect


failures = []
tensors, expected = {}, {}
for name, dtype, shape in [("model.embed_tokens.weight", "BF16", [17, 8]), ("model.norm.weight", "F32", [8]),
                           ("lm_head.weight", "F16", [17, 8]), ("position_ids", "I32", [1, 5]),
                           ("empty", "F32", [0, 4]), ("scalar", "F32", [])]:
    tensors[name], expected[name] = tensor(dtype, shape)
reference_file = os.path.join(workdir, "reference.safetensors")
# safetensors 0.8 serializes from raw buffers (TensorSpec); the buffers must outlive the call.
TORCH_NAMES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16", "I32": "int32"}
buffers = {name: ctypes.create_string_buffer(entry["data"], max(1, len(entry["data"]))) for name, entry in tensors.items()}
specs = {name: safetensors.TensorSpec(dtype=TORCH_NAMES[entry["dtype"]], shape=entry["shape"],
                                      data_ptr=ctypes.addressof(buffers[name]), data_len=len(entry["data"]))
         for name, entry in tensors.items()}
with open(reference_file, "wb") as out:
    out.write(safetensors.serialize(specs, metadata={"format": "pt", "note": "made by the reference"}))

# 1. mxtrain reads what the reference wrote.
dump = json.loads(subprocess.run([tool, "dump", reference_file], check=True, capture_output=True, text=True).stdout)
for name, entry in tensors.items():
    got = dump.get(name)
    if got is None or got["dtype"] != entry["dtype"] or got["shape"] != entry["shape"]:
        failures.append("read %s: %r" % (name, got))
    elif expected[name] is not None and got["values"] != expected[name]:
        failures.append("read %s: values differ" % name)
if dump.get("__metadata__") != {"format": "pt", "note": "made by the reference"}:
    failures.append("metadata %r" % dump.get("__metadata__"))

# 2. The reference reads what mxtrain wrote: same names, dtypes, shapes, bytes, metadata.
copy_file = os.path.join(workdir, "copy.safetensors")
subprocess.run([tool, "copy", reference_file, copy_file], check=True)
with open(copy_file, "rb") as f:
    copied = dict(safetensors.deserialize(f.read()))
for name, entry in tensors.items():
    got = copied.get(name)
    if got is None or got["dtype"] != entry["dtype"] or list(got["shape"]) != entry["shape"] or \
            bytes(got["data"]) != entry["data"]:
        failures.append("reference read of mxtrain's %s differs" % name)
with open(copy_file, "rb") as f:
    header_length = struct.unpack("<Q", f.read(8))[0]
    if header_length % 8 != 0:
        failures.append("header length %d is not a multiple of 8" % header_length)
    if json.loads(f.read(header_length))["__metadata__"] != {"format": "pt", "note": "made by the reference"}:
        failures.append("metadata not kept")

# 3. Damaged files: whatever the reference refuses, mxtrain refuses with a message (exit 1), and
#    never crashes.
original = open(reference_file, "rb").read()
damaged = []
for cut in (0, 4, 8, 20, len(original) // 2, len(original) - 1):
    damaged.append(("truncated at %d" % cut, original[:cut]))
for _ in range(200):
    data = bytearray(original)
    for _ in range(rng.randrange(1, 4)):
        data[rng.randrange(0, min(len(data), 8 + header_length))] = rng.randrange(256)
    damaged.append(("flipped bytes", bytes(data)))
refused_by_reference = 0
for what, data in damaged:
    try:
        safetensors.deserialize(data)
        reference_ok = True
    except Exception:
        reference_ok = False
        refused_by_reference += 1
    path = os.path.join(workdir, "damaged.safetensors")
    with open(path, "wb") as f:
        f.write(data)
    run = subprocess.run([tool, "dump", path], capture_output=True, text=True)
    if run.returncode not in (0, 1):
        failures.append("%s: mxtrain exited %d (%s)" % (what, run.returncode, run.stderr.strip()[:200]))
    elif not reference_ok and run.returncode == 0:
        failures.append("%s: the reference refuses it, mxtrain accepted it" % what)
    elif run.returncode == 1 and "safetensors file" not in run.stderr and "cannot" not in run.stderr:
        failures.append("%s: unclear message %r" % (what, run.stderr[:200]))

print("safetensors reference: %d tensors both ways, %d damaged files (%d refused by the reference)"
      % (len(tensors), len(damaged), refused_by_reference))
for failure in failures:
    print("FAIL:", failure)
sys.exit(1 if failures else 0)
