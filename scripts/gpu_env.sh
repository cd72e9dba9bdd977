#!/usr/bin/env bash
# Sourced on the GPU machine before running binaries built on the development machine: points
# the loader at the CUDA libraries they were linked against (cuDNN 9.19, NCCL, NVRTC from the
# PyTorch wheel there), keeps NVLink multicast off, and makes the source-tree path compiled into
# the test binaries (/work/main) resolve to this checkout.
site=/opt/torch/.venv/lib/python3.12/site-packages/nvidia
dirs=""
for lib in libcudnn.so.9 libnccl.so.2 libnvrtc.so.13 libcublasLt.so.13 libcudart.so.13; do
  found=$(find "$site" -name "$lib" 2>/dev/null | head -1)
  [ -n "$found" ] && dirs="$dirs:$(dirname "$found")"
done
export LD_LIBRARY_PATH="${dirs#:}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export NCCL_NVLS_ENABLE=${NCCL_NVLS_ENABLE:-0}
if [ "$PWD" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work && ln -s "$PWD" /work/main; fi
# Debian libraries the GPU machine's image may lack (libmpi_cxx, Open MPI's C++ bindings;
# libutf8proc): copies in .gpu-libs (tests/cuda/carry_binaries.sh unpack puts them there, also
# after this is sourced) are the last resort on the search path.
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$PWD/.gpu-libs"
