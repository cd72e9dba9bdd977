#include "mxtrain/plan/gpu_catalog.hpp"

#include <algorithm>
#include <cctype>

namespace mxtrain {

const std::vector<GpuSpec>& gpu_catalog() {
  constexpr double GiB = 1024.0 * 1024 * 1024;
  constexpr double TB = 1e12;
  constexpr double GB = 1e9;
  // Sources: NVIDIA H100 and H200 Tensor Core GPU datasheets (SXM); DGX B200 and HGX B300
  // datasheets. NVLink: 900 GB/s (Hopper) and 1.8 TB/s (Blackwell) total bidirectional per GPU,
  // half per direction. NICs: ConnectX-7 400 Gb/s per GPU (H100/H200/B200), ConnectX-8 800 Gb/s (B300).
  static const std::vector<GpuSpec> catalog = {
      {"h100", "NVIDIA H100 80GB HBM3", 90, 79.6 * GiB, 3.35 * TB, 989e12, 1979e12, 0, 450 * GB, 50 * GB, 8, false},
      {"h200", "NVIDIA H200", 90, 140.4 * GiB, 4.8 * TB, 989e12, 1979e12, 0, 450 * GB, 50 * GB, 8, false},
      {"b200", "NVIDIA B200", 100, 178.0 * GiB, 8.0 * TB, 2250e12, 4500e12, 9000e12, 900 * GB, 50 * GB, 8, true},
      {"b300", "NVIDIA B300", 103, 268.0 * 1e9, 8.0 * TB, 2250e12, 4500e12, 13500e12, 900 * GB, 100 * GB, 8, true},
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

double peak_flops(const GpuSpec& gpu, DType dtype) {
  switch (dtype) {
    case DType::bf16: case DType::f16: return gpu.bf16_flops;
    case DType::e4m3: case DType::e5m2: return gpu.fp8_flops;
    case DType::e2m1: return gpu.fp4_flops;
    default: return 0;
  }
}

}  // namespace mxtrain
