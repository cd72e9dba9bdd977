#!/usr/bin/env bash
# quack's GEMMs with fused SwiGLU epilogues against cuBLASLt, from C++ (bench/quack_probe.cpp).
#   PYTHON=<venv with quack-kernels> bash bench/quack_probe.sh aot   here: compiles and exports the
#       kernels without a GPU (bench/quack_export.py) and links the probe into .quack/; needs the
#       TVM-FFI headers, libtvm_ffi and the CuTe DSL's static shim that scripts/fa4_kernels.sh
#       gathers into .fa4-kernels/ (FA4_KERNELS=<folder> to use another)
#   bash bench/quack_probe.sh probe M H F   on the GPU machine (device call carrying .quack):
#       writes $OUT/quack_probe.txt
set -euo pipefail
case ${1:-} in
aot)
  py=${PYTHON:-.deps/fa4-venv/bin/python3}
  ffi=${FA4_KERNELS:-.fa4-kernels}
  cuda=${CUDA_HOME:-/usr/local/cuda}
  [ -f "$ffi/lib/libtvm_ffi.so" ] || { echo "quack_probe.sh: no $ffi/lib/libtvm_ffi.so; run scripts/fa4_kernels.sh first" >&2; exit 1; }
  rm -rf .quack.partial && mkdir -p .quack.partial
  "$py" bench/quack_export.py .quack.partial
  grep -v '^#' .quack.partial/quack_kernels.txt | awk '{print "QUACK_FUNCTION(" $1 ", " $2 ")"}' > .quack.partial/quack_function_list.inc
  g++ -std=c++20 -O2 bench/quack_probe.cpp -I.quack.partial -Isrc -I"$ffi/include" -I"$cuda/include" .quack.partial/quack_*.o \
    -o .quack.partial/quack_probe -L"$ffi/lib" -ltvm_ffi "$ffi/lib/libcuda_dialect_runtime_static.a" \
    -L"$cuda/lib64" -lcublasLt -lcudart -ldl -Wl,-rpath,'$ORIGIN'
  cp "$ffi/lib/libtvm_ffi.so" .quack.partial/
  rm .quack.partial/quack_*.o
  rm -rf .quack && mv .quack.partial .quack
  du -sh .quack ;;
probe)
  set +eu  # scripts/gpu_env.sh is written for an interactive shell
  source scripts/gpu_env.sh
  shift
  (( $# == 3 )) || set -- 16384 2048 5632  # llama-1b 8x2048
  .quack/quack_probe "$@" 2>&1 | tee -a "${OUT:-.}/quack_probe.txt" ;;
*) echo "usage: bench/quack_probe.sh aot | probe [M H F]" >&2; exit 2 ;;
esac
