#!/bin/bash
# FlashAttention-4's Hopper attention backward for the trainer (train.attention_backward =
# flash-attention-4; docs/attention.md) and quack's BF16 GEMMs for the GEMM autotune
# (docs/gemm-kernels.md): compiles them here, without a GPU, and gathers what the CUDA build links: one object file a function and configuration, TVM-FFI's runtime library and
# headers, and the CuTe DSL's static CUDA shim.
#
#   scripts/fa4_kernels.sh [OUTDIR] [HEAD_DIM:GROUP ...]
#     OUTDIR     default .fa4-kernels (ignored by git; a device call carries it by that name)
#     HEAD_DIM:GROUP  the head dimensions and query heads per key/value head to compile; the
#                default covers every model preset and Llama 3.2 1B: 64:1 (gpt2-*), 64:2 (tiny),
#                64:4 (Llama 3.2 1B), 64:8 (llama-1b, TinyLlama's shape), 128:1 (te-fsdp),
#                128:3 (llama-3b), 128:4 (llama-8b), 128:5 (llama-14b, -32b), 128:8 (llama-64b)
#   then: cmake ... -DMXTRAIN_FLASH_ATTENTION_4=$PWD/OUTDIR
#   QUACK_ONLY=1 scripts/fa4_kernels.sh [OUTDIR]: re-export only quack's GEMMs into an existing
#                folder (1 min; what scripts/setup.sh runs when only quack_gemm_export.py changed)
#
# OUTDIR/SOURCES holds the sha256 of the two export scripts that made it (sha256sum's format):
# scripts/setup.sh and the cmake configure compare it with the checkout's scripts, so a folder
# made by an older export (missing functions the code now expects) is made again, not used.
#
# PYTHON names a Python that has the packages below; without it a venv is made in
# .deps/fa4-venv from PyPI (about 5 GB: torch with its CUDA wheels, which flash-attn-4's
# interface imports; its fake tensors stand in for the GPU). Compiling takes 4-6 s a
# configuration on two cores.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-.fa4-kernels}
shift || true
configs=("$@")
[ ${#configs[@]} -gt 0 ] || configs=(64:1 64:2 64:4 64:8 128:1 128:3 128:4 128:5 128:8)
py=${PYTHON:-}
if [ -z "$py" ]; then
  venv=.deps/fa4-venv
  if [ ! -x $venv/bin/python3 ]; then
    python3 -m venv $venv
    $venv/bin/pip install -q nvidia-cutlass-dsl-libs-base==4.8.1 nvidia-cutlass-dsl-libs-core==4.8.1 \
      nvidia-cutlass-dsl-libs-cu13==4.8.1 "apache-tvm-ffi<0.2,>=0.1.11" einops torch==2.11.0
    $venv/bin/pip install -q --no-deps flash-attn-4==4.0.0b36 quack-kernels==0.6.5 nvidia-cutlass-dsl==4.8.1
  fi
  py=$venv/bin/python3
fi
ffi=$("$py" -c 'import os, tvm_ffi; print(os.path.dirname(tvm_ffi.__file__))')
dsl=$("$py" -m cutlass.cute.export.aot_config --libdir 2>/dev/null | tail -1)
[ -f "$dsl/libcuda_dialect_runtime_static.a" ] || { echo "no libcuda_dialect_runtime_static.a under '$dsl'" >&2; exit 1; }
if [ "${QUACK_ONLY:-0}" = 1 ]; then
  [ -f "$out/fa4_kernels.txt" ] || { echo "QUACK_ONLY=1: $out is not a kernel folder; run scripts/fa4_kernels.sh without it" >&2; exit 1; }
  # Export into a fresh folder, then swap the quack files; SOURCES changes last, so an
  # interrupted swap leaves a stale stamp and the next setup exports again.
  work=$(mktemp -d "${out%/}.partial.XXXXXX")
  trap 'rm -rf "$work"' EXIT
  "$py" scripts/quack_gemm_export.py "$work"
  rm -f "$out"/quack_*
  mv "$work"/quack_* "$out/"
  { grep -v " scripts/quack_gemm_export.py$" "$out/SOURCES" 2>/dev/null || true; sha256sum scripts/quack_gemm_export.py; } > "$work/SOURCES"
  mv "$work/SOURCES" "$out/SOURCES"
  rm -rf "$work"
  trap - EXIT
  echo "quack's GEMMs re-exported into $out"
  exit 0
fi
# Build into a fresh folder and move it into place at the end: a failed export leaves no half folder.
work=$(mktemp -d "${out%/}.partial.XXXXXX")
trap 'rm -rf "$work"' EXIT
"$py" scripts/fa4_export.py "$work" "${configs[@]}"
# quack's BF16 GEMMs for the GEMM autotune and the gated SwiGLU GEMM (docs/gemm-kernels.md), from the same venv: 1 min.
"$py" scripts/quack_gemm_export.py "$work"
mkdir -p "$work/lib" "$work/include"
cp "$ffi/lib/libtvm_ffi.so" "$dsl/libcuda_dialect_runtime_static.a" "$work/lib/"
cp -r "$ffi/include/tvm" "$ffi/include/dlpack" "$work/include/"
"$py" -c 'from importlib.metadata import version as v
print("flash-attn-4", v("flash-attn-4"), "quack-kernels", v("quack-kernels"), "nvidia-cutlass-dsl", v("nvidia-cutlass-dsl"), "apache-tvm-ffi", v("apache-tvm-ffi"))' \
  > "$work/VERSIONS"
sha256sum scripts/fa4_export.py scripts/quack_gemm_export.py > "$work/SOURCES"
rm -rf "$out" && mv "$work" "$out"
trap - EXIT
du -sh "$out"
echo "configure with -DMXTRAIN_FLASH_ATTENTION_4=$(cd "$out" && pwd)"
