#include "mxtrain/hw/gpu_catalog.hpp"

#include <algorithm>
#include <cctype>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

const std::vector<GpuSpec>& gpu_catalog() {
  constexpr double GiB = 1024.0 * 1024 * 1024;
  constexpr double TB = 1e12;
  constexpr double GB = 1e9;
  // Sources: NVIDIA H100 and H200 Tensor Core GPU datasheets (SXM); DGX B200 and HGX B300
  // datasheets (per-GPU figures = system figures / 8). NVLink: 900 GB/s (Hopper) and 1.8 TB/s
  // (Blackwell) total bidirectional per GPU, half per direction. NICs: ConnectX-7 400 Gb/s per
  // GPU (H100/H200/B200), ConnectX-8 800 Gb/s (B300). SMs: 132 (H100/H200 SXM), 148 (B200),
  // 160 (B300). FP32 (CUDA cores): 67 TFLOP/s (Hopper SXM), 80 (B200), 75 (B300).
  // Memory: cudaMemGetInfo totals (nvidia-smi: 81,559 MiB H100, 143,771 MiB H200, 183,359 MiB
  // B200); B300 as the issue states it (268 GB usable).
  static const std::vector<GpuSpec> catalog = {
      {"h100", "NVIDIA H100 80GB HBM3", 90, 132, 79.6 * GiB, 3.35 * TB, 989e12, 1979e12, 0, 67e12, 450 * GB, 50 * GB,
       8, false},
      {"h200", "NVIDIA H200", 90, 132, 140.4 * GiB, 4.8 * TB, 989e12, 1979e12, 0, 67e12, 450 * GB, 50 * GB, 8, false},
      {"b200", "NVIDIA B200", 100, 148, 178.0 * GiB, 8.0 * TB, 2250e12, 4500e12, 9000e12, 80e12, 900 * GB, 50 * GB, 8,
       true},
      {"b300", "NVIDIA B300", 103, 160, 268.0 * 1e9, 8.0 * TB, 2250e12, 4500e12, 13500e12, 75e12, 900 * GB, 100 * GB,
       8, true},
  };
  return catalog;
}

const GpuSpec* find_gpu(const std::string& key_or_name) {
  std::string lowered;
  for (char c : key_or_name) lowered += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const GpuSpec& gpu : gpu_catalog())
    if (lowered == gpu.key) return &gpu;
  for (const GpuSpec& gpu : gpu_catalog())
    if (lowered.find(gpu.key) != std::string::npos) return &gpu;
  return nullptr;
}

const GpuSpec& require_gpu(const std::string& key) {
  if (const GpuSpec* gpu = find_gpu(key)) return *gpu;
  std::string keys;
  for (const GpuSpec& gpu : gpu_catalog()) {
    if (!keys.empty()) keys += ", ";
    keys += gpu.key;
  }
  throw Error(ErrorKind::config, "unknown GPU '" + key + "'", "use --gpu with one of: " + keys);
}

double peak_flops(const GpuSpec& gpu, DType dtype) {
  switch (dtype) {
    case DType::bf16: case DType::f16: return gpu.bf16_flops;
    case DType::e4m3: case DType::e5m2: return gpu.fp8_flops;
    case DType::e2m1: return gpu.fp4_flops;
    default: return 0;
  }
}

std::vector<DType> native_quantized_gemms(const GpuSpec& gpu) {
  std::vector<DType> dtypes;
  if (gpu.compute_capability >= 89) dtypes.push_back(DType::e4m3);
  if (gpu.native_block_scaling) {
    dtypes.push_back(DType::e8m0);
    dtypes.push_back(DType::e2m1);
  }
  return dtypes;
}

double gemm_peak_flops(const GpuSpec& gpu, DType dtype, bool tf32) {
  if (dtype == DType::f32) return tf32 ? gpu.bf16_flops / 2 : gpu.fp32_flops;
  return peak_flops(gpu, dtype);
}

}  // namespace mxtrain
