#!/usr/bin/env bash
# Sets up mxtrain on Debian 12: installs the Debian packages it builds against, fetches the
# cudnn-frontend headers when a CUDA toolkit is present, builds (CUDA backend when nvcc exists),
# and prepares the real-text corpus from the Debian package `fortunes`. Safe to run twice:
# every step checks what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

packages=(build-essential cmake ninja-build git pkg-config python3 python3-pip libtomlplusplus-dev libcli11-dev
          nlohmann-json3-dev libopenblas-dev libgtest-dev libgmock-dev libbenchmark-dev libopenmpi-dev
          openmpi-bin fortunes libpcre2-dev libutf8proc-dev libsentencepiece-dev libzstd-dev chromium)
[ "${MXTRAIN_WITH_FA4:-0}" = 1 ] && packages+=(python3-venv)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=(); [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# cudnn-frontend is header-only and not in Debian: take its headers from the PyPI wheel.
nvcc_path=$(command -v nvcc || true)
[ -z "$nvcc_path" ] && [ -x /usr/local/cuda/bin/nvcc ] && nvcc_path=/usr/local/cuda/bin/nvcc
deps=$root/.deps
if [ -n "$nvcc_path" ] && [ ! -f "$deps/include/cudnn_frontend.h" ]; then
  echo "setup: fetching cudnn-frontend headers (PyPI nvidia-cudnn-frontend)"
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: -d "$tmp" nvidia-cudnn-frontend
  mkdir -p "$deps"
  python3 - "$tmp" "$deps" <<'PY'
import glob, sys, zipfile
wheel = glob.glob(sys.argv[1] + "/*.whl")[0]
with zipfile.ZipFile(wheel) as archive:
    for name in archive.namelist():
        if name.startswith("include/") and not name.endswith("/"):
            archive.extract(name, sys.argv[2])
PY
  rm -rf "$tmp"
fi

# FlashAttention-4's attention backward (train.attention_backward = flash-attention-4,
# docs/attention.md), opt-in: MXTRAIN_WITH_FA4=1 compiles its kernels without a GPU (a venv of
# about 5 GB with torch, in .deps/fa4-venv) and links them.
fa4_flags=()
if [ "${MXTRAIN_WITH_FA4:-0}" = 1 ]; then
  [ -n "$nvcc_path" ] || { echo "setup: MXTRAIN_WITH_FA4=1 needs the CUDA toolkit (nvcc): its kernels are CUDA code" >&2; exit 1; }
  # Made again where the export scripts changed since (the folder's SOURCES stamp): all of it
  # for FlashAttention-4's, quack's GEMMs alone for quack's.
  made_by() { grep -F " scripts/$1" "$root/.fa4-kernels/SOURCES" 2>/dev/null | (cd "$root" && sha256sum -c --status 2>/dev/null); }
  if [ ! -f "$root/.fa4-kernels/fa4_kernels.txt" ] || ! made_by fa4_export.py; then
    "$root/scripts/fa4_kernels.sh" .fa4-kernels
  elif ! made_by quack_gemm_export.py; then
    QUACK_ONLY=1 "$root/scripts/fa4_kernels.sh" .fa4-kernels
  fi
  fa4_flags=(-DMXTRAIN_FLASH_ATTENTION_4="$root/.fa4-kernels")
fi

preset=${MXTRAIN_PRESET:-auto}
cmake --preset "$preset" -DCMAKE_PREFIX_PATH="$deps" -DCMAKE_INCLUDE_PATH="$deps/include" "${fa4_flags[@]}" >/dev/null
cmake --build --preset "$preset" -j "$(nproc)"

# The corpus: about 2.4 MB of English prose and verse from /usr/share/games/fortunes.
corpus=$root/data/fortunes
if [ ! -f "$corpus/val_000000.bin" ]; then
  texts=()
  for file in /usr/share/games/fortunes/*; do
    case "$file" in *.dat|*.u8) continue ;; esac
    [ -f "$file" ] && texts+=("$file")
  done
  "$root/build/$preset/mxtrain" prepare --output "$corpus" --val-fraction 0.05 "${texts[@]}"
fi
echo "setup: done (binary build/$preset/mxtrain, corpus $corpus)"
