"""Compile FlashAttention-4's Hopper attention kernels (PyPI flash-attn-4, NVIDIA's CuTe DSL) for one
attention shape without a GPU and export each compiled function as a C object file, the way a C++
program calls them: a TVM-FFI packed function `__tvm_ffi_mxtrain_fa4_<name>` that checks its
arguments (count, dtypes, ranks, unit last stride, 16-byte alignment) and launches on the stream
TVMFFIEnvGetStream returns. Needs torch, nvidia-cutlass-dsl, flash-attn-4 and quack-kernels;
no GPU (FlashAttention-4's CPU-only compilation: FLASH_ATTENTION_ARCH, CUTE_DSL_ARCH).

Usage: python3 bench/fa4_export.py OUTDIR BATCH SEQUENCE Q_HEADS KV_HEADS HEAD_DIM
(the batch, sequence and head counts are runtime values of the compiled functions, but the
library's choices, e.g. split-KV in the forward for a small grid, follow the shape it is given).
Writes OUTDIR/fa4_{fwd,bwd_pre,bwd,bwd_post_dq}.o, with grouped-query heads fa4_bwd_post_dkv.o,
and OUTDIR/fa4_signatures.txt (the backward's tiles, and each function's arguments as its error
message states them). bench/fa4_aot_probe.cpp calls them."""
import os, sys, time
out_dir = sys.argv[1]
B, T, H, KV, head_dim = (int(a) for a in sys.argv[2:7])
os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ.setdefault("FLASH_ATTENTION_NUM_SMS", "132")
os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "0"
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flash_attn.cute import interface as fa

os.makedirs(out_dir, exist_ok=True)
started = time.time()
with FakeTensorMode(allow_non_fake_inputs=True):
    q = torch.empty(B, T, H, head_dim, dtype=torch.bfloat16, device="cuda")
    k = torch.empty(B, T, KV, head_dim, dtype=torch.bfloat16, device="cuda")
    v = torch.empty(B, T, KV, head_dim, dtype=torch.bfloat16, device="cuda")
    out, lse = fa._flash_attn_fwd(q, k, v, causal=True, return_lse=True)[:2]
    fa._flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, causal=True)

def only(cache, name):
    functions = list(cache.cache.values())
    assert len(functions) == 1, "%s: %d compiled functions, expected one" % (name, len(functions))
    return functions[0]


# The postprocess that writes BF16 dQ from its FP32 accumulator, and with grouped-query heads the
# one for dK and dV (FlashAttention-4 compiles one per tile: a key of (dtype, head dim, tile rows,
# threads, atom layout, swap, ...); they are one function where the tiles agree).
cfg = fa._tile_size_bwd_sm90(head_dim, head_dim, True, False)
post = {(key[2], key[4], key[5]): fn for key, fn in fa._bwd_postprocess_convert.compile_cache.cache.items()}
functions = {"fwd": only(fa._flash_attn_fwd.compile_cache, "fwd"),
             "bwd_pre": only(fa._bwd_preprocess.compile_cache, "bwd_pre"),
             "bwd": only(fa._flash_attn_bwd.compile_cache, "bwd"),
             "bwd_post_dq": post.pop((cfg.m_block_size, cfg.AtomLayoutMdQ, cfg.dQ_swapAB))}
if H != KV:
    key = (cfg.n_block_size, cfg.AtomLayoutNdKV, cfg.dKV_swapAB)
    functions["bwd_post_dkv"] = post.pop(key) if key in post else functions["bwd_post_dq"]
assert not post, "postprocesses left unexported: %s" % list(post)
with open(os.path.join(out_dir, "fa4_signatures.txt"), "w") as signatures:
    signatures.write("tiles: %d query rows, %d key rows (the backward's workspaces are rounded to them)\n"
                     % (cfg.m_block_size, cfg.n_block_size))
    for name, function in functions.items():
        path = os.path.join(out_dir, "fa4_%s.o" % name)
        function.export_to_c(path, function_name="mxtrain_fa4_" + name)
        text = open(path, "rb").read()
        start = text.find(b"`__call__(")
        signatures.write("%s: %s\n" % (name, text[start + 1:text.find(b"`", start + 1)].decode()))
print("exported %s in %.1f s (%dx%d, %d/%d heads, head dim %d, causal, sm_90a)" % (
    ", ".join(functions), time.time() - started, B, T, H, KV, head_dim))
