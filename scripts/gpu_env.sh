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
# libmpi_cxx (Open MPI's C++ bindings) may be missing there: a copy carried in .gpu-libs is the
# last resort on the search path.
[ -d .gpu-libs ] && export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$PWD/.gpu-libs"
