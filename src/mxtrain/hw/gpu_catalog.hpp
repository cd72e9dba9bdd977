// GPUs the planner knows, from vendor datasheets (dense, i.e. without 2:4 sparsity). Memory is
// what a process can allocate (cudaMemGetInfo's total), not the marketing figure. How close a
// real step gets to these peaks is not here: that is calibration data (plan/calibration.hpp).
#pragma once
#include <string>
#include <vector>

#include "mxtrain/core/dtype.hpp"

namespace mxtrain {

struct GpuSpec {
  std::string key;                  // "h100", "h200", "b200", "b300"
  std::string name;                 // "NVIDIA H200"
  int compute_capability = 0;       // 90, 100, 103
  int multiprocessors = 0;          // SMs: GEMM tiles are scheduled in waves of this many
  double memory_bytes = 0;          // usable device memory
  double hbm_bytes_per_s = 0;       // datasheet HBM bandwidth
  double bf16_flops = 0;            // dense tensor-core peaks
  double fp8_flops = 0;
  double fp4_flops = 0;             // 0 when the GPU has no FP4 tensor cores
  double fp32_flops = 0;            // CUDA-core FP32 (fp32 precision without TF32)
  double nvlink_bytes_per_s = 0;    // per GPU, one direction
  double internode_bytes_per_s = 0; // per GPU, one direction (NIC)
  int gpus_per_node = 8;
  bool native_block_scaling = false;  // MXFP8/NVFP4 tensor cores (sm_100+)
};

const std::vector<GpuSpec>& gpu_catalog();
// By key ("h200") or by a device name containing the product ("NVIDIA H200"); nullptr if unknown.
const GpuSpec* find_gpu(const std::string& key_or_name);
// By key; throws Error(config) listing the known keys.
const GpuSpec& require_gpu(const std::string& key);
// Dense peak FLOP/s of the tensor cores for GEMM operands of `dtype` (bf16/f16, e4m3/e5m2, e2m1);
// f32 is counted at the bf16 rate only through TF32, so it returns 0 for f32.
double peak_flops(const GpuSpec& gpu, DType dtype);
// The quantized GEMM operand formats the GPU's tensor cores run (a backend's supports(linear_forward,
// ...) answers): per-tensor FP8 (e4m3) from sm_89, MXFP8 (e8m0 scales) and NVFP4 (e2m1) from sm_100.
std::vector<DType> native_quantized_gemms(const GpuSpec& gpu);
// The rate a GEMM with operands of `dtype` runs at: peak_flops, or for f32 the TF32 tensor-core
// rate (half the bf16 peak) when tf32 is on and the CUDA-core FP32 rate otherwise.
double gemm_peak_flops(const GpuSpec& gpu, DType dtype, bool tf32);

}  // namespace mxtrain
