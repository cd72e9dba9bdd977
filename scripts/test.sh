#!/usr/bin/env bash
# Sets everything up (the build, and the Python reference packages of the format tests), then
# runs the CPU test suite (labels cpu and mpi). The CUDA code is built
# too where nvcc exists, so compile errors are caught; its tests (label cuda) need a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
./scripts/python_env.sh
ctest --test-dir "build/${MXTRAIN_PRESET:-auto}" -L 'cpu|mpi' --output-on-failure -j "$(nproc)" --timeout 900
