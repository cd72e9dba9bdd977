"""Compile FlashAttention-4's Hopper attention backward (PyPI flash-attn-4: FlashAttention-3's
sm_90 backward in NVIDIA's CuTe DSL) for the trainer, without a GPU, and export each compiled
function as a C object file: a TVM-FFI packed function that checks its arguments and launches on
the stream TVMFFIEnvGetStream returns. scripts/fa4_kernels.sh runs this and gathers what the
build links (docs/attention.md).

Usage: python3 scripts/fa4_export.py OUTDIR HEAD_DIM:GROUP ...
  HEAD_DIM (8..128, a multiple of 8) and GROUP (query heads per key/value head) are what the
  compiled code is specialized on; batch, sequence length and head counts are runtime values
  (the sequence must span more than one tile: the library compiles a single-tile variant apart).
Writes, for each configuration tag d<D>_g<G>, OUTDIR/fa4_<tag>_{bwd_pre,bwd,bwd_post_dq}.o (and
_bwd_post_dkv.o where G > 1) holding __tvm_ffi_mxtrain_fa4_<tag>_<name>, and OUTDIR/fa4_kernels.txt:
one line a configuration, "tag D G query_tile key_tile rounded_head_dim", then each function's
argument list as its own error message states it."""
import os, sys, time

if len(sys.argv) < 3:
    sys.exit(__doc__)
out_dir = sys.argv[1]
configs = []
for spec in sys.argv[2:]:
    d, g = (int(x) for x in spec.split(":"))
    if not (8 <= d <= 128 and d % 8 == 0 and g >= 1):
        sys.exit("%s: head dimensions 8..128 in multiples of 8 and a group of at least 1 are supported" % spec)
    configs.append((d, g))
os.environ.setdefault("FLASH_ATTENTION_ARCH", "sm_90")
os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
os.environ["FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED"] = "0"
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from flash_attn.cute import interface as fa
from importlib.metadata import version

os.makedirs(out_dir, exist_ok=True)
lines, signatures = [], []
for d, g in configs:
    started = time.time()
    tag = "d%d_g%d" % (d, g)
    for cache in (fa._bwd_preprocess, fa._flash_attn_bwd, fa._bwd_postprocess_convert):
        cache.compile_cache.cache.clear()
    B, T, KV = 2, 1024, 2  # any shape of more than one tile a side: these are runtime values
    H = KV * g
    with FakeTensorMode(allow_non_fake_inputs=True):
        q = torch.empty(B, T, H, d, dtype=torch.bfloat16, device="cuda")
        k = torch.empty(B, T, KV, d, dtype=torch.bfloat16, device="cuda")
        v = torch.empty(B, T, KV, d, dtype=torch.bfloat16, device="cuda")
        out = torch.empty(B, T, H, d, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(B, H, T, dtype=torch.float32, device="cuda")
        fa._flash_attn_bwd(q, k, v, out, torch.empty_like(out), lse, causal=True)
    cfg = fa._tile_size_bwd_sm90(d, d, True, False)
    rounded = (d + (63 if cfg.dKV_swapAB else 31)) // (64 if cfg.dKV_swapAB else 32) * (64 if cfg.dKV_swapAB else 32)

    def only(cache, name):
        functions = list(cache.compile_cache.cache.values())
        assert len(functions) == 1, "%s: %d compiled functions, expected one" % (name, len(functions))
        return functions[0]

    # The postprocess writing BF16 dQ from its FP32 accumulator and, with grouped heads, the one
    # for dK and dV: one compiled function a tile (a key of dtype, head dim, tile rows, threads,
    # atom layout, swap, ...); a single function where the two tiles agree.
    post = {(key[2], key[4], key[5]): fn for key, fn in fa._bwd_postprocess_convert.compile_cache.cache.items()}
    functions = {"bwd_pre": only(fa._bwd_preprocess, "bwd_pre"), "bwd": only(fa._flash_attn_bwd, "bwd"),
                 "bwd_post_dq": post.pop((cfg.m_block_size, cfg.AtomLayoutMdQ, cfg.dQ_swapAB))}
    if g > 1:
        key = (cfg.n_block_size, cfg.AtomLayoutNdKV, cfg.dKV_swapAB)
        functions["bwd_post_dkv"] = post.pop(key) if key in post else functions["bwd_post_dq"]
    assert not post, "postprocesses left unexported: %s" % list(post)
    for name, function in functions.items():
        path = os.path.join(out_dir, "fa4_%s_%s.o" % (tag, name))
        function.export_to_c(path, function_name="mxtrain_fa4_%s_%s" % (tag, name))
        text = open(path, "rb").read()
        start = text.find(b"`__call__(")
        signatures.append("# %s %s: %s" % (tag, name, text[start + 1:text.find(b"`", start + 1)].decode()))
    lines.append("%s %d %d %d %d %d" % (tag, d, g, cfg.m_block_size, cfg.n_block_size, rounded))
    print("%s: exported %s in %.1f s (causal, bf16, sm_90a)" % (tag, ", ".join(functions), time.time() - started))
with open(os.path.join(out_dir, "fa4_kernels.txt"), "w") as manifest:
    manifest.write("# FlashAttention-4 %s backward kernels for sm_90a, causal, bf16 (scripts/fa4_export.py)\n"
                   "# tag head_dim group query_tile key_tile rounded_head_dim\n" % version("flash-attn-4"))
    manifest.write("\n".join(lines + signatures) + "\n")
