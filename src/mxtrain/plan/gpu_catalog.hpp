// GPUs the planner knows, from vendor datasheets (dense, i.e. without 2:4 sparsity), plus the
// efficiency factors calibrated from measured runs (plan/calibration). Memory is what a process
// can allocate, not the marketing figure.
#pragma once
#include <string>
#include <vector>

#include "mxtrain/core/dtype.hpp"

namespace mxtrain {

struct GpuSpec {
  std::string key;                  // "h100", "h200", "b200", "b300"
  std::string name;                 // "NVIDIA H200"
  int compute_capability = 0;       // 90, 100, 103
  double memory_bytes = 0;          // usable device memory
  double hbm_bytes_per_s = 0;       // datasheet HBM bandwidth
  double bf16_flops = 0;            // dense tensor-core peaks
  double fp8_flops = 0;
  double fp4_flops = 0;             // 0 when the GPU has no FP4 tensor cores
  double nvlink_bytes_per_s = 0;    // per GPU, one direction
  double internode_bytes_per_s = 0; // per GPU, one direction (NIC)
  int gpus_per_node = 8;
  bool native_block_scaling = false;  // MXFP8/NVFP4 tensor cores (sm_100+)
};

const std::vector<GpuSpec>& gpu_catalog();
// By key ("h200") or by a device name containing the product ("NVIDIA H200"); nullptr if unknown.
const GpuSpec* find_gpu(const std::string& key_or_name);
// Dense peak FLOP/s of the tensor cores for GEMM operands of `dtype` (bf16/f16, e4m3/e5m2, e2m1);
// f32 is counted at the bf16 rate only through TF32, so it returns 0 for f32.
double peak_flops(const GpuSpec& gpu, DType dtype);

}  // namespace mxtrain
