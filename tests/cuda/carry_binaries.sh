#!/usr/bin/env bash
# Runs on the GPU machine the binaries built on the development machine, instead of building
# there (a CUDA build takes about 200 s of a device call; unpacking takes seconds).
#   bash tests/cuda/carry_binaries.sh pack     # here: build build/auto's mxtrain and mxtrain_cuda_tests,
#                                              # write .carrybin/{mxtrain,mxtrain_cuda_tests}.xz (about 27 MB)
#   bash tests/cuda/carry_binaries.sh unpack   # there, from the repository root, before running
#                                              # build/auto/mxtrain or build/auto/tests/mxtrain_cuda_tests
# Where the build links FlashAttention-4's and quack's kernels, the one file of `.fa4-kernels` they
# need at run time, libtvm_ffi.so, travels in .carrybin too (the rest is linked in); so do the
# Debian libraries the GPU machine's image may lack (libutf8proc), unpacked into .gpu-libs. The call
# carries `.carrybin` (and `data` for the two tests that read the prepared corpus) and sources
# scripts/gpu_env.sh, which points the loader at the GPU machine's CUDA libraries and makes the
# source path compiled into the tests resolve. The build must be for the GPU's architecture:
# build/auto on a machine without a GPU compiles for sm_90, Hopper (docs/building.md). xz because both machines have it (and Python's lzma
# reads it where the command does not exist); the binaries are mostly device code, which xz
# halves. Add `/.carrybin/` to .git/info/exclude: the folder is not part of the source tree.
set -euo pipefail
binaries=(mxtrain tests/mxtrain_cuda_tests)
tvm=.fa4-kernels/lib/libtvm_ffi.so
tvm_dir=$PWD/.fa4-kernels/lib  # in mxtrain's RUNPATH when the build links the kernels
unxz() {  # unxz PACKED TARGET: xz, or Python's lzma where the command is missing
  if command -v xz > /dev/null; then
    xz -dc "$1" > "$2.part"
  else
    python3 -c 'import lzma, shutil, sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2], "wb"))' "$1" "$2.part"
  fi
  mv "$2.part" "$2"
}
case ${1:-} in
  pack)
    cmake --build build/auto -j"$(nproc)" --target mxtrain mxtrain_cuda_tests
    mkdir -p .carrybin
    for b in "${binaries[@]}"; do
      xz -T0 -6 -c "build/auto/$b" > ".carrybin/$(basename "$b").xz.part"
      mv ".carrybin/$(basename "$b").xz.part" ".carrybin/$(basename "$b").xz"
    done
    # Debian libraries the GPU machine's image may not have: carried, and found there last.
    rm -f .carrybin/*.so.*.lib
    for lib in libutf8proc.so.2; do
      path=$(ldd build/auto/mxtrain | awk -v l="$lib" '$1 == l { print $3 }')
      [[ -n $path ]] && cp -L "$path" ".carrybin/$lib.lib"
    done
    rm -f .carrybin/libtvm_ffi.so.xz
    if readelf -d build/auto/mxtrain | grep -q "$tvm_dir"; then
      xz -T0 -6 -c "$tvm" > .carrybin/libtvm_ffi.so.xz.part && mv .carrybin/libtvm_ffi.so.xz.part .carrybin/libtvm_ffi.so.xz
    fi
    ls -l .carrybin
    ;;
  unpack)
    mkdir -p build/auto/tests
    for b in "${binaries[@]}"; do
      packed=.carrybin/$(basename "$b").xz
      [[ -f $packed ]] || { echo "carry_binaries.sh: $packed missing: run 'pack' here and carry .carrybin" >&2; exit 1; }
      unxz "$packed" "build/auto/$b"
      chmod +x "build/auto/$b"
    done
    for lib in .carrybin/*.so.*.lib; do
      [[ -f $lib ]] || continue
      mkdir -p .gpu-libs
      name=$(basename "$lib" .lib)
      # The machine's own copy wins (gpu_env.sh puts .gpu-libs last on the search path).
      cp "$lib" ".gpu-libs/$name"
    done
    if [[ -f .carrybin/libtvm_ffi.so.xz ]]; then
      mkdir -p "$(dirname "$tvm")"
      unxz .carrybin/libtvm_ffi.so.xz "$tvm"
    fi
    ;;
  *) echo "usage: bash tests/cuda/carry_binaries.sh pack|unpack" >&2; exit 2 ;;
esac
