#!/bin/bash
# FlashAttention-4 (PyPI flash-attn-4: FlashAttention's kernels in NVIDIA's CuTe DSL, Hopper and
# Blackwell) beside cuDNN on the GPU machine, which has neither it nor the CuTe DSL and cannot
# reach the network. Its wheels travel with the device calls; the DSL's compiler library
# (nvidia-cutlass-dsl-libs-cu13, 92 MB as a wheel) is over one call's 64 MiB, so it travels
# recompressed in two pieces over two calls made back to back (the machine stays warm between).
#
#   bench/flash_attn4.sh fetch          here: wheels into .whl2, the DSL library's first piece into .whl
#   device call 1, carry [".whl"]:  mkdir -p /tmp/stage && cp .whl/cu13.tar.xz.part.aa /tmp/stage/
#   device call 2, carry [".whl2"]: bash bench/flash_attn4.sh device   (writes $OUT/attention_libraries.txt)
#
# The same kernels called from C++ with no Python at run time (bench/fa4_aot_probe.cpp), built
# here without a GPU by a Python that has torch 2.11, nvidia-cutlass-dsl and -libs-cu13 4.8.1,
# flash-attn-4 4.0.0b36, quack-kernels 0.6.5 and apache-tvm-ffi 0.1.15 (a venv: about 5 GB with
# torch's CUDA wheels; torch is imported by flash-attn-4's interface, its fake tensors do the shapes):
#   PYTHON=/path/to/venv/bin/python3 bench/flash_attn4.sh aot B,T,H,KV,D ...   here: .fa4/ (a probe a shape)
#   device call, carry [".fa4"]: bash bench/flash_attn4.sh probe   (writes $OUT/fa4_aot_probe.txt)
#
# Results: bench/results/h200_attention_libraries.md.
set -euo pipefail
FA4=4.0.0b36 DSL=4.8.1
case "${1:-}" in
fetch)
  work=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 -d "$work" \
    flash-attn-4==$FA4 nvidia-cutlass-dsl==$DSL nvidia-cutlass-dsl-libs-base==$DSL nvidia-cutlass-dsl-libs-core==$DSL \
    nvidia-cutlass-dsl-libs-cu13==$DSL "apache-tvm-ffi<0.2,>=0.1.11" torch-c-dlpack-ext==0.1.5 quack-kernels==0.6.5
  mkdir -p "$work/cu13"
  (cd "$work/cu13" && unzip -q ../nvidia_cutlass_dsl_libs_cu13-*.whl && tar cf - . | xz -9e -T2 > "$work/cu13.tar.xz")
  rm -rf .whl .whl2 && mkdir .whl .whl2
  (cd .whl && split -b 40m "$work/cu13.tar.xz" cu13.tar.xz.part. && mv cu13.tar.xz.part.a[b-z] ../.whl2/)
  sha256sum "$work/cu13.tar.xz" | cut -d' ' -f1 > .whl2/cu13.sha256
  rm "$work"/nvidia_cutlass_dsl_libs_cu13-*.whl && mv "$work"/*.whl .whl2/ && rm -rf "$work"
  du -sh .whl .whl2 ;;
device)
  PY=/opt/torch/.venv/bin/python3
  part_a=.whl/cu13.tar.xz.part.aa; [ -f $part_a ] || part_a=/tmp/stage/cu13.tar.xz.part.aa
  [ -f $part_a ] || { echo "the library's first piece is not here: make call 1 again, then this at once"; exit 3; }
  cat $part_a .whl2/cu13.tar.xz.part.a[b-z] > /tmp/cu13.tar.xz
  echo "$(cat .whl2/cu13.sha256)  /tmp/cu13.tar.xz" | sha256sum -c
  mkdir -p /tmp/site
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl2/*.whl
  tar xJf /tmp/cu13.tar.xz -C /tmp/site
  nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,power.limit --format=csv
  set -o pipefail
  PYTHONUNBUFFERED=1 timeout 480 $PY -c 'import site, sys, runpy; site.addsitedir("/tmp/site")
sys.argv = ["bench/attention_libraries.py"]; runpy.run_path("bench/attention_libraries.py", run_name="__main__")' \
    2>&1 | tee "$OUT/attention_libraries.txt" ;;
aot)
  py=${PYTHON:-python3}
  shift
  [ $# -ge 1 ] || { echo "usage: bench/flash_attn4.sh aot B,T,H,KV,D ..." >&2; exit 2; }
  rm -rf .fa4 && mkdir -p .fa4
  ffi=$("$py" -c 'import os, tvm_ffi; print(os.path.dirname(tvm_ffi.__file__))')
  dsl=$("$py" -m cutlass.cute.export.aot_config --libdir 2>/dev/null | tail -1)
  cuda=${CUDA_HOME:-/usr/local/cuda}
  # g++, not nvcc: the probe has no device code, and nvcc 13.0's front end stops on it.
  g++ -std=c++20 -O2 -c bench/fa4_aot_probe.cpp -o .fa4/probe.o -Isrc -I.gpu-deps/include -I"$ffi/include" -I"$cuda/include"
  for shape in "$@"; do  # one probe a shape: the exported functions are specialized by D and the grouping
    dir=.fa4/${shape//,/-}
    "$py" bench/fa4_export.py "$dir" ${shape//,/ }
    g++ .fa4/probe.o "$dir"/fa4_*.o -o "$dir/fa4_aot_probe" -L"$ffi/lib" -ltvm_ffi "$dsl/libcuda_dialect_runtime_static.a" \
      -L"$cuda/lib64" -L"$cuda/lib64/stubs" -lcudart -lcudnn -lnvrtc -ldl -Wl,-rpath,'$ORIGIN/..'
    rm "$dir"/fa4_*.o
  done
  rm .fa4/probe.o
  cp "$ffi/lib/libtvm_ffi.so" .fa4/
  du -sh .fa4 ;;
probe)  # on the GPU machine, after aot here: every probe .fa4 holds
  set +eu  # scripts/gpu_env.sh is written for an interactive shell
  source scripts/gpu_env.sh
  for dir in .fa4/*-*/; do
    shape=$(basename "$dir")
    "$dir/fa4_aot_probe" ${shape//-/ } || echo "exit $?"
  done 2>&1 | tee "$OUT/fa4_aot_probe.txt" ;;
*) echo "usage: bench/flash_attn4.sh fetch|device|aot B,T,H,KV,D ...|probe" >&2; exit 2 ;;
esac
