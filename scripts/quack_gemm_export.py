"""Compile quack's Hopper BF16 GEMMs (PyPI quack-kernels, Apache-2.0: the CuTe DSL GEMM library
FlashAttention-4 is built on) for the trainer's GEMM autotune, without a GPU, and export each
compiled function as a C object file holding a TVM-FFI packed function that launches on the
stream TVMFFIEnvGetStream returns. scripts/fa4_kernels.sh runs this into the same folder as
FlashAttention-4's kernels (docs/gemm-kernels.md).

Usage: python3 scripts/quack_gemm_export.py OUTDIR
Writes OUTDIR/quack_<layout>_<config>.o (function __tvm_ffi_mxtrain_quack_<layout>_<config>) and
OUTDIR/quack_gemms.txt: one line a function, "layout config tile_m tile_n cluster_m cluster_n
pingpong", then each function's argument list as its error message states it.

The layouts are cuBLAS's column-major D[m, n] = op(A)[m, k] · op(B)[k, n] of the three linear ops
(backend/cuda/gemm.hpp), seen row-major as quack takes them, D[n, m] = op(B)ᵀ · op(A)ᵀ:
  tn  the forward, x · Wᵀ:          quack's A [rows, k] k-major, B [k, cols] k-major
  nn  the input gradient, dY · W:   A k-major, B cols-major (row-major [k, cols])
  nt  the weight gradient, dYᵀ · x: A rows-major (a transposed row-major matrix), B row-major
All BF16 in and out with FP32 accumulation, no epilogue: D = A · B. And the llama MLP's gate/up
forward with SwiGLU in the epilogue (quack's gated GEMM, row-major, the weight's gate and up rows
interleaved as mxtrain stores them):
  gated  preact [rows, 2F] = x [rows, k] · W [2F, k]ᵀ, postact [rows, F] = silu(preact[:, 2j]) ·
         preact[:, 2j + 1], SwiGLU applied to the FP32 product
The compiled code is generic in the sizes and leading dimensions (multiples of 8 elements, 16-byte
aligned)."""
import os, sys, time

CONFIGS = [(128, 192, 2, 1, True), (128, 192, 1, 2, True), (128, 128, 2, 1, True), (256, 128, 2, 1, False),
           (128, 256, 2, 1, False)]  # (tile_m, tile_n, cluster_m, cluster_n, pingpong), from quack's Hopper space
# The gated GEMM's: the fastest four of seven at llama-1b's and llama-3b's MLPs on an H200
# (bench/results/h200_quack_probe_84d8f8f.txt), the llama-1b winner first (the one taken when
# train.gemm_autotune is off).
GATED_CONFIGS = [(128, 128, 2, 1, True), (128, 192, 1, 2, True), (128, 192, 2, 1, True), (256, 192, 2, 1, False)]


def prepare():
    """quack compiling for sm_90a with no GPU: compiled functions (no disk cache), the cluster
    count a runtime argument, and every launch recorded instead of run. Returns the record."""
    os.environ.setdefault("QUACK_ARCH", "sm_90")
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import quack.cache as quack_cache
    import quack.gemm as quack_gemm
    import quack.gemm_runtime.host as quack_host
    quack_cache.CACHE_ENABLED = False
    # Persistent kernels take the number of clusters that fit as an argument; quack would ask the
    # driver, which a machine without a GPU lacks. The caller passes its GPU's own at run time.
    quack_host.get_max_active_clusters = lambda cluster_size, **_: 132 // cluster_size
    quack_gemm.get_max_active_clusters = quack_host.get_max_active_clusters
    launched = []

    def record(plan, A, B, D, C, epi_args, scheduler_args, varlen_args, SFA=None, SFB=None):
        launched.append(plan.compiled_fn)

    quack_host.launch_gemm = record
    quack_gemm.launch_gemm = record
    return launched


def config_of(c):
    from quack.gemm_config import GemmConfig
    return GemmConfig(tile_m=c[0], tile_n=c[1], cluster_m=c[2], cluster_n=c[3], pingpong=c[4],
                      is_dynamic_persistent=False, device_capacity=9)


def tag_of(c):
    return "%dx%d_c%dx%d_%s" % (c[0], c[1], c[2], c[3], "pp" if c[4] else "coop")


def export(launched, path, function):
    """Exports the one function the last call launched; returns its argument list."""
    assert len(launched) == 1, "%d launches recorded, expected one" % len(launched)
    launched[0].export_to_c(path, function_name=function)
    text = open(path, "rb").read()
    start = text.find(b"`__call__(")
    return text[start + 1:text.find(b"`", start + 1)].decode()


def plain_gemm(A, B, out, config, concat=None):
    from quack import gemm_interface as gi
    gi._gemm_execute(A, B, out, None, bias=None, alpha=1.0, beta=1.0, cu_seqlens_m=None, cu_seqlens_k=None,
                     A_idx=None, batch_idx_permute=None, add_to_output=False, dynamic_scheduler=False, config=config,
                     rounding_mode=0, sr_seed=0, concat_layout=concat, SFA=None, SFB=None, split_k=1, split_k_mode=0)


def gated_gemm(x, w, preact, postact, config):
    from quack import gemm_interface as gi
    gi._gemm_act_call(x, w.T, preact, postact, None, None, activation="swiglu", concat_layout=None,
                      dynamic_scheduler=False, tuned=False, config=config)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    launched = prepare()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from importlib.metadata import version

    def t(*shape):
        return torch.empty(*shape, dtype=torch.bfloat16, device="cuda")

    R, K, C = 4096, 2048, 5632  # any sizes: rows of D, the contraction, columns of D
    layouts = {
        "tn": lambda: (t(R, K), t(C, K).T, t(R, C)),   # x [R, K] · Wᵀ, W [C, K] row-major
        "nn": lambda: (t(R, K), t(K, C), t(R, C)),     # dY [R, K] · W [K, C]
        "nt": lambda: (t(K, R).T, t(K, C), t(R, C)),   # dYᵀ with dY [K, R] row-major · x [K, C]
    }
    os.makedirs(out_dir, exist_ok=True)
    lines, signatures = [], []
    for layout, operands in list(layouts.items()) + [("gated", None)]:
        for c in GATED_CONFIGS if layout == "gated" else CONFIGS:
            started = time.time()
            launched.clear()
            with FakeTensorMode(allow_non_fake_inputs=True):
                if layout == "gated":
                    gated_gemm(t(R, K), t(2 * C, K), t(R, 2 * C), t(R, C), config_of(c))
                else:
                    A, B, D = operands()
                    plain_gemm(A, B, D, config_of(c))
            name = "%s_%s" % (layout, tag_of(c))
            signature = export(launched, os.path.join(out_dir, "quack_%s.o" % name), "mxtrain_quack_%s" % name)
            signatures.append("# %s: %s" % (name, signature))
            lines.append("%s %s %d %d %d %d %d" % (layout, tag_of(c), c[0], c[1], c[2], c[3], int(c[4])))
            print("quack %s: exported in %.1f s (bf16, sm_90a)" % (name, time.time() - started), flush=True)
    with open(os.path.join(out_dir, "quack_gemms.txt"), "w") as manifest:
        manifest.write("# quack-kernels %s BF16 GEMMs for sm_90a (scripts/quack_gemm_export.py)\n"
                       "# layout config tile_m tile_n cluster_m cluster_n pingpong\n" % version("quack-kernels"))
        manifest.write("\n".join(lines + signatures) + "\n")


if __name__ == "__main__":
    main()
