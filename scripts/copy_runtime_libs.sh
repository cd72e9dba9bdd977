#!/usr/bin/env bash
# Copies the shared libraries a binary loads, as `ldd` resolves them, under DEST at their real
# directories (so /lib -> /usr/lib symlinks of the image stay intact) with the names the binary
# asks for: the Dockerfile's runtime stage takes them from the build stage this way.
#
# Left out: the C library and the dynamic loader (every base image has the same ones as the
# build stage's) and the NVIDIA driver's libraries (libcuda, libnvidia-*), which the container
# runtime mounts from the host to match its driver. Open MPI dlopens its plugins, which ldd does
# not list: when libmpi is among the libraries, its installation directory and help files come
# along whole. What the CUDA libraries dlopen (cuDNN 9's graph and engine libraries, NVRTC's
# builtins) comes from the runtime stage's base image, the CUDA runtime image with cuDNN of the
# same tag as the build stage's. tests/sagemaker/dockerfile_test.py runs this script on the CPU
# build.
#
# Usage: scripts/copy_runtime_libs.sh BINARY DEST
set -euo pipefail
binary=$1 dest=$2
listing=$(ldd "$binary")
if grep -q "not found" <<<"$listing"; then
  echo "copy_runtime_libs: $binary needs libraries that are not installed:" >&2
  grep "not found" <<<"$listing" >&2
  exit 1
fi
mkdir -p "$dest"
awk '/=> \// {print $3}' <<<"$listing" | while read -r library; do
  name=$(basename "$library")
  case "$name" in
    libc.so.*|libm.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*|libcuda.so*|libnvidia-*) continue ;;
  esac
  directory=$(readlink -f "$(dirname "$library")")
  mkdir -p "$dest$directory"
  cp "$(readlink -f "$library")" "$dest$directory/$name"
  if [[ $name == libmpi.so.* ]]; then
    # Debian and Ubuntu: LIBDIR/openmpi/lib holds the plugins (openmpi3/) and the wrapper libraries.
    for extra in "$directory/openmpi/lib" /usr/share/openmpi /etc/openmpi; do
      [ -d "$extra" ] || continue
      mkdir -p "$dest$(dirname "$extra")"
      cp -a "$extra" "$dest$(dirname "$extra")/"
    done
  fi
done
