"""Compile quack's Hopper GEMMs with fused SwiGLU epilogues (PyPI quack-kernels, Apache-2.0: Tri Dao's
group's CuTe DSL kernels, the ones FlashAttention-4 depends on) without a GPU, and export each as
an object file holding a TVM-FFI packed function, for bench/quack_probe.cpp to time from C++
beside cuBLASLt. The four GEMMs a gated MLP's gate/up projection needs when its weight is stored
[gate; up] (as mxtrain stored it when this probe was written; it now stores the rows
interleaved, docs/gemm-kernels.md) and its pre-activation interleaved (as quack's epilogues read it):

  gated   x · W1ᵀ → preact (interleaved gate/up pairs) and postact = silu(gate) · up, one kernel
  dgated  dY · W2 → with the saved preact: dpreact (interleaved) and the recomputed postact
  dx      dpreact · W1 (W1's rows read in interleaved order)
  dw1     dpreactᵀ · x → dW1 written back in [gate; up] order

Usage: python3 bench/quack_export.py OUTDIR
Writes OUTDIR/quack_<kernel>_<config>.o (function __tvm_ffi_mxtrain_quack_<kernel>_<config>) and
OUTDIR/quack_kernels.txt: "kernel config tile_m tile_n cluster_m cluster_n pingpong", then each
function's argument list as its error message states it."""
import os, sys, time

if len(sys.argv) != 2:
    sys.exit(__doc__)
out_dir = sys.argv[1]
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "scripts"))
from quack_gemm_export import prepare, config_of, tag_of, export, plain_gemm  # the trainer's export steps

launched = prepare()
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from importlib.metadata import version
from quack import gemm_interface as gi

M, H, F = 16384, 2048, 5632  # llama-1b; the compiled code is generic in M, N and K
# (tile_m, tile_n, cluster_m, cluster_n, pingpong): quack's Hopper search space, a few from it.
CONFIGS = [(128, 192, 2, 1, True), (128, 192, 1, 2, True), (128, 128, 2, 1, True), (256, 128, 2, 1, False),
           (256, 192, 2, 1, False), (256, 160, 1, 2, False), (128, 256, 2, 1, False)]
os.makedirs(out_dir, exist_ok=True)
lines, signatures, seen = [], [], []


def t(*shape):
    return torch.empty(*shape, dtype=torch.bfloat16, device="cuda")


def gated(cfg):
    x, w1 = t(M, H), t(2 * F, H)
    gi._gemm_act_call(x, w1.T, t(M, 2 * F), t(M, F), None, None, activation="swiglu", concat_layout=("B",),
                      dynamic_scheduler=False, tuned=False, config=cfg)


def dgated(cfg):
    dy, w2, preact = t(M, H), t(H, F), t(M, 2 * F)
    gi._gemm_dact_call(dy, w2, preact, t(M, 2 * F), t(M, F), activation="swiglu", dynamic_scheduler=False,
                       tuned=False, config=cfg)


def dx(cfg):
    plain_gemm(t(M, 2 * F), t(2 * F, H), t(M, H), cfg, ("B",))


def dw1(cfg):
    dpreact, x = t(M, 2 * F), t(M, H)
    plain_gemm(dpreact.T, x, t(2 * F, H), cfg, ("out",))


for name, fn in (("gated", gated), ("dgated", dgated), ("dx", dx), ("dw1", dw1)):
    for c in CONFIGS:
        if name in ("gated", "dgated") and c[1] % 32:
            continue
        started = time.time()
        launched.clear()
        try:
            with FakeTensorMode(allow_non_fake_inputs=True):
                fn(config_of(c))
        except Exception as error:  # a configuration quack's kernel cannot build: skipped, and said so
            print("%s %s: not compiled (%s: %s)" % (name, tag_of(c), type(error).__name__, str(error)[:200]))
            continue
        if any(launched[0] is f for f in seen):  # quack mapped this configuration onto one already exported
            print("%s %s: the same compiled function as an earlier configuration, skipped" % (name, tag_of(c)))
            continue
        seen.append(launched[0])
        function = "mxtrain_quack_%s_%s" % (name, tag_of(c))
        signature = export(launched, os.path.join(out_dir, "quack_%s_%s.o" % (name, tag_of(c))), function)
        signatures.append("# %s %s: %s" % (name, tag_of(c), signature))
        lines.append("%s %s %d %d %d %d %d" % (name, tag_of(c), c[0], c[1], c[2], c[3], int(c[4])))
        print("%s %s: exported in %.1f s" % (name, tag_of(c), time.time() - started), flush=True)
with open(os.path.join(out_dir, "quack_kernels.txt"), "w") as manifest:
    manifest.write("# quack-kernels %s GEMMs for sm_90a, bf16 (bench/quack_export.py)\n"
                   "# kernel config tile_m tile_n cluster_m cluster_n pingpong\n" % version("quack-kernels"))
    manifest.write("\n".join(lines + signatures) + "\n")
