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
And GPT-2's MLP with its GELU (tanh approximation) in the epilogues, row-major:
  gelu   preact [rows, F] = x [rows, k] · W [F, k]ᵀ + bias [F] (BF16), postact = gelu(preact),
         GELU applied to the FP32 sum
  dgelu  dx [rows, F] = (dY [rows, k] · W [k, F]) ⊙ gelu'(preact [rows, F]), the derivative at the
         stored 16-bit pre-activation applied to the FP32 product (quack's dact epilogue without
         its recomputed post-activation output, which mxtrain keeps from the forward)
  dgelub dgelu with the bias gradient of the layer that made the pre-activation: partials f32
         [row tiles, F], row t the sum of the FP32 dx over tile t's rows (quack's RowVecReduce;
         mxtrain sums the rows of partials in a fixed order after it)
And the LM head's linear cross-entropy in quack's scaled-exp form (quack/linear_cross_entropy.py;
docs/gemm-kernels.md), row-major, one chunk of rows at a time, V the padded vocabulary, d the
hidden size:
  lce_fwd     E [rows, V] = exp(z - k) in BF16 for the logits z = x [rows, d] · W [V, d]ᵀ, with a
              power-of-two offset k per (row, 192- or 256-column tile), the tiles' sums of E, the
              offsets, and the target's logit; a column mask [V] (0, or -inf for the padding columns) is
              added to z first, so padding columns get E = 0 and count in no sum
  lce_dx_*    dx [rows, d] = v ⊙ ((u ⊙ E) · W): E scaled per (row, 64-column block) by the strip u
              on its way to the tensor cores, the per-row v in the epilogue
  lce_dw_*    dW [V, d] f32 = (u ⊙ E)ᵀ · xs, stored (lce_dw) or added to dW (lce_dwadd) by TMA
The compiled code is generic in the sizes and leading dimensions (multiples of 8 elements, 16-byte
aligned)."""
import os, sys, time

CONFIGS = [(128, 192, 2, 1, True), (128, 192, 1, 2, True), (128, 128, 2, 1, True), (256, 128, 2, 1, False),
           (128, 256, 2, 1, False)]  # (tile_m, tile_n, cluster_m, cluster_n, pingpong), from quack's Hopper space
# The gated GEMM's: the fastest four of seven at llama-1b's and llama-3b's MLPs on an H200
# (bench/results/h200_quack_probe_84d8f8f.txt), the llama-1b winner first (the one taken when
# train.gemm_autotune is off).
GATED_CONFIGS = [(128, 128, 2, 1, True), (128, 192, 1, 2, True), (128, 192, 2, 1, True), (256, 192, 2, 1, False)]
# GPT-2's GELU GEMMs (hidden k = 768 ... 1,600, F = 4k): quack's Hopper default first.
GELU_CONFIGS = [(128, 192, 2, 1, True), (128, 128, 2, 1, True), (128, 256, 2, 1, False), (256, 128, 2, 1, False)]


# The linear cross-entropy's: the forward's column tile is the offsets' granularity and must divide
# the padded vocabulary: 192 (quack's choice; GPT-2's 50,304 and Llama 3's 128,256 columns), else
# 256 (TinyLlama's 32,000), pingpong at 192 and cooperative at 256 as quack takes them; the gradient
# GEMMs' column tile over the hidden size, 192 where it divides it (GPT-2 124M's 768) else 256.
LCE_FORWARD_TILES = ((192, True), (256, False))
LCE_GRAD_TILES = (192, 256)


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


def gelu_gemm(x, w, bias, preact, postact, config):
    from quack import gemm_interface as gi
    gi._gemm_act_call(x, w.T, preact, postact, None, bias, activation="gelu_tanh_approx", concat_layout=None,
                      dynamic_scheduler=False, tuned=False, config=config)


def dgelu_gemm(dy, w, preact, dx, config):
    """dx = (dy · w) ⊙ gelu'(preact), w [k, F] row-major; quack's dact_mod without mAuxOut."""
    from quack.activation import dgelu_tanh_approx
    from quack.epilogue.frontend import gemm_epilogue

    @gemm_epilogue()
    def dgelu_epi(acc, c):
        grad, _ = dgelu_tanh_approx(c, acc)
        return {"D": grad}

    dgelu_epi(dy, w, preact, out={"D": dx}, config=config, tuned=False, dynamic_scheduler=False)


def dgelu_bias_gemm(dy, w, preact, dx, partials, config):
    """dgelu_gemm and the bias gradient's partial sums, one row of partials per tile of rows
    (quack's dgelu_dbias_mod without its post-activation output)."""
    from quack.activation import dgelu_tanh_approx
    from quack.epilogue.frontend import gemm_epilogue
    from quack.epilogue.ops import RowVecReduce

    @gemm_epilogue(reduces={"dbias": RowVecReduce("dbias")})
    def dgelu_bias_epi(acc, c):
        grad, _ = dgelu_tanh_approx(c, acc)
        return {"D": grad, "dbias": grad}

    dgelu_bias_epi(dy, w, preact, out={"D": dx, "dbias": partials}, config=config, tuned=False,
                   dynamic_scheduler=False)


def lce_mods():
    """The linear cross-entropy's epilogues and A-operand transforms. The forward is quack's
    scaled_exp_target_epi with a column mask added to the logits before the offsets' maximum and
    the exponent (GPT-2's vocabulary is padded from 50,257 to 50,304 columns)."""
    from quack.epilogue.frontend import gemm_epilogue
    from quack.epilogue.math import pexp2
    from quack.epilogue.ops import ColVecLoad, ColVecReduce, ColVecSelect, RowVecLoad
    from quack.epilogue.scaled_exp import LOG2E, MaxLog2
    from quack.linear_cross_entropy import _lce_dw_scale, _lce_dx_scale, _lce_vscale_epi
    from quack.epilogue.library import identity_epi
    max_log2, target = MaxLog2("max_log2"), ColVecLoad("target")

    def masked_max(acc, mask):
        return {"max_log2": acc + mask}

    @gemm_epilogue(ops={"max_log2": max_log2, "mask": RowVecLoad("mask")}, prepass=masked_max,
                   prepass_outs=("max_log2",), reduces={"sum_exp": ColVecReduce("sum_exp")},
                   outs={"target_logit": ColVecSelect("target_logit", idx_op=target)},
                   extra_ops=(max_log2.out("max_log2_out"), target))
    def masked_scaled_exp_target(acc, max_log2, mask):
        e = pexp2((acc + mask) * LOG2E - max_log2)
        return {"D": e, "sum_exp": e, "target_logit": acc}

    return masked_scaled_exp_target, _lce_dx_scale, _lce_vscale_epi, _lce_dw_scale, identity_epi


def lce_exports(t):
    """(layout, tag, tile_m, tile_n, cluster_m, cluster_n, pingpong, launch) for the linear
    cross-entropy's functions; launch() records one call at sizes of any value."""
    import torch
    from quack.operand_transform.host import transform_a_operand
    fwd, dx_scale, vscale_epi, dw_scale, identity_epi = lce_mods()
    rows, d, V = 4096, 768, 50304 * 4
    f32 = dict(dt=torch.float32)

    def forward(tile_n, pingpong):
        T = V // tile_n
        fwd.gemm(t(rows, d), t(V, d), t(rows, V), epi_args=dict(
            max_log2=tile_n, mask=t(1, V, **f32), sum_exp=t(rows, T, **f32), max_log2_out=t(rows, T, **f32),
            target=t(rows, dt=torch.int32), target_logit=t(rows, **f32)),
            tile_M=128, tile_N=tile_n, cluster_M=2, cluster_N=1, pingpong=pingpong)

    def dx(tile_n):
        E = t(rows, V)
        bundle = transform_a_operand(dx_scale, E, {"u": t(V // 64, rows)}, 128, 64)
        vscale_epi.gemm(bundle, t(V, d).mT, t(rows, d), epi_args=dict(v=t(rows, **f32).unsqueeze(0)),
                        transform_a=dx_scale, tile_M=128, tile_N=tile_n, tile_K=64, cluster_M=2, cluster_N=1)

    def dw(tile_n, add):
        E = t(rows, V)
        bundle = transform_a_operand(dw_scale, E.t(), {"u": t(V // 64, rows)}, 128, 64)
        identity_epi.gemm(bundle, t(rows, d).mT, t(V, d, **f32), epi_args={}, transform_a=dw_scale,
                          add_to_output=add, tile_M=128, tile_N=tile_n, tile_K=64, cluster_M=1, cluster_N=2)

    found = [("lce_fwd", "128x%d_c2x1_%s" % (n, "pp" if pp else "coop"), 128, n, 2, 1, int(pp),
              lambda n=n, pp=pp: forward(n, pp)) for n, pp in LCE_FORWARD_TILES]
    for n in LCE_GRAD_TILES:
        found.append(("lce_dx", "128x%d_c2x1_coop" % n, 128, n, 2, 1, 0, lambda n=n: dx(n)))
        found.append(("lce_dw", "128x%d_c1x2_coop" % n, 128, n, 1, 2, 0, lambda n=n: dw(n, False)))
        found.append(("lce_dwadd", "128x%d_c1x2_coop" % n, 128, n, 1, 2, 0, lambda n=n: dw(n, True)))
    return found


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out_dir = sys.argv[1]
    launched = prepare()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from importlib.metadata import version

    def t(*shape, dt=torch.bfloat16):
        return torch.empty(*shape, dtype=dt, device="cuda")

    R, K, C = 4096, 2048, 5632  # any sizes: rows of D, the contraction, columns of D
    layouts = {
        "tn": lambda: (t(R, K), t(C, K).T, t(R, C)),   # x [R, K] · Wᵀ, W [C, K] row-major
        "nn": lambda: (t(R, K), t(K, C), t(R, C)),     # dY [R, K] · W [K, C]
        "nt": lambda: (t(K, R).T, t(K, C), t(R, C)),   # dYᵀ with dY [K, R] row-major · x [K, C]
    }
    os.makedirs(out_dir, exist_ok=True)
    lines, signatures = [], []

    def emit(layout, tag, tm, tn, cm, cn, pp, launch):
        """Records launch()'s one call and exports it as quack_<layout>_<tag>.o."""
        started = time.time()
        launched.clear()
        with FakeTensorMode(allow_non_fake_inputs=True):
            launch()
        name = "%s_%s" % (layout, tag)
        signature = export(launched, os.path.join(out_dir, "quack_%s.o" % name), "mxtrain_quack_%s" % name)
        signatures.append("# %s: %s" % (name, signature))
        lines.append("%s %s %d %d %d %d %d" % (layout, tag, tm, tn, cm, cn, int(pp)))
        print("quack %s: exported in %.1f s (bf16, sm_90a)" % (name, time.time() - started), flush=True)

    for layout, operands in layouts.items():
        for c in CONFIGS:
            emit(layout, tag_of(c), *c, lambda c=c, operands=operands: plain_gemm(*operands(), config_of(c)))
    for c in GATED_CONFIGS:
        emit("gated", tag_of(c), *c, lambda c=c: gated_gemm(t(R, K), t(2 * C, K), t(R, 2 * C), t(R, C), config_of(c)))
    for c in GELU_CONFIGS:
        emit("gelu", tag_of(c), *c, lambda c=c: gelu_gemm(t(R, K), t(C, K), t(C), t(R, C), t(R, C), config_of(c)))
        emit("dgelu", tag_of(c), *c, lambda c=c: dgelu_gemm(t(R, K), t(K, C), t(R, C), t(R, C), config_of(c)))
        emit("dgelub", tag_of(c), *c, lambda c=c: dgelu_bias_gemm(t(R, K), t(K, C), t(R, C), t(R, C),
                                                                   t(R // c[0], C, dt=torch.float32), config_of(c)))
    for export_args in lce_exports(t):
        emit(*export_args)
    with open(os.path.join(out_dir, "quack_gemms.txt"), "w") as manifest:
        manifest.write("# quack-kernels %s BF16 GEMMs for sm_90a (scripts/quack_gemm_export.py)\n"
                       "# layout config tile_m tile_n cluster_m cluster_n pingpong\n" % version("quack-kernels"))
        manifest.write("\n".join(lines + signatures) + "\n")


if __name__ == "__main__":
    main()
