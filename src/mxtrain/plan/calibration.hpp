// How close real kernels get to a GPU's datasheet peaks, and what the allocator does not see:
// the planner's calibration, as committed data (configs/plan/calibration.json) rather than
// constants in code. Each GPU's entry overrides the "default" entry field by field, so a GPU
// without measurements uses the default factors, which are fractions of its own peaks.
//
// Files are layered: the committed file, then the --calibration overlay (`mxtrain tune` writes
// one), which overrides the fields it names.
#pragma once
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/backend/dryrun/dryrun_backend.hpp"
#include "mxtrain/hw/gpu_catalog.hpp"

namespace mxtrain {

// One candidate GEMM tile of the library's kernels: output tile m x n and the fraction of the
// large-GEMM efficiency that kernel reaches.
struct GemmTile {
  int64_t m = 128, n = 256;
  double efficiency = 1.0;
};

struct GpuCalibration {
  std::string gpu;     // catalog key
  std::string source;  // where the numbers come from, in words

  // GEMM time = flops / (peak · gemm_peak_fraction · tile utilisation · k / (k + gemm_k_half)),
  // tile utilisation = m·n·split / (waves · SMs · tile_m · tile_n) for the best tile and split-K
  // (splits only while tiles·split <= SMs and k/split >= gemm_split_k_min, at a penalty).
  double gemm_peak_fraction = 0.8;
  double gemm_k_half = 128;
  double gemm_split_k_min = 512;
  double gemm_split_k_efficiency = 0.85;
  std::vector<GemmTile> gemm_tiles;

  // Attention time = flops / (peak · fraction · s / (s + seq_half) · d / (d + head_dim_half)).
  double attention_forward_fraction = 0.7;
  double attention_backward_fraction = 0.5;
  double attention_seq_half = 256;
  double attention_head_dim_half = 32;
  // train.attention_backward = flash-attention-4: the backward's efficiency is the above with
  // backward_fraction · gain and d/(d + its own head_dim_half) (FlashAttention-4 loses less at
  // head dimension 64 than cuDNN does).
  double flash_attention_4_backward_gain = 0.878;
  double flash_attention_4_head_dim_half = 3.7;

  // Memory-bound ops: bytes / (HBM bandwidth · bandwidth_fraction).
  double bandwidth_fraction = 0.85;
  // The casts (quantize, dequantize) of the block formats use their own fraction where one is
  // given (0: bandwidth_fraction): their kernels find a scale per 32 (MXFP8) or per 16 (NVFP4,
  // with a second-level scale, and the random Hadamard transform for wgrad operands) elements, so
  // they run well below a copy's bandwidth — on Hopper, where both formats are emulated
  // (quantize, dequantize, BF16 GEMM), those passes are the difference to BF16.
  double mxfp8_cast_fraction = 0;
  double nvfp4_cast_fraction = 0;
  double host_to_device_bytes_per_s = 25e9;
  double launch_overhead_s = 4e-6;  // per op (kernel launch and tail)

  // Collectives: bytes / (link bandwidth · fraction) + latency.
  double nvlink_fraction = 0.75;
  double internode_fraction = 0.8;
  double collective_latency_s = 20e-6;

  // Outside the allocator, per process.
  double cuda_context_bytes = 0;
  double nccl_buffer_bytes = 0;  // per NCCL communicator (FSDP creates two or three)

  // Inside the allocator: the device facts backend/cuda sizes its in-op buffers with, as modelled
  // (the buffers themselves are backend/private_buffers.hpp's).
  CudaAllocationModel cuda_allocations;

  // Measured / predicted step time from `mxtrain tune` (1 = uncorrected).
  double step_time_scale = 1.0;
};

class Calibration {
 public:
  // The committed file, then `extra_path` ("" = none) over it.
  static Calibration load(const std::string& extra_path = "");
  // From JSON documents, later ones overriding earlier ones (tests, tune).
  static Calibration from_json(const std::vector<nlohmann::json>& layers);
  static std::string committed_path();

  GpuCalibration for_gpu(const GpuSpec& gpu) const;
  const std::vector<std::string>& sources() const { return sources_; }  // files read, in order
  const nlohmann::json& merged() const { return merged_; }

 private:
  nlohmann::json merged_;
  std::vector<std::string> sources_;
};

// Parses a JSON file; a missing or unreadable file and invalid JSON are config errors that name
// `what` (e.g. "the calibration file ", or "") and the path, with the fix for each case.
nlohmann::json read_json_file(const std::string& path, const std::string& what, const std::string& unreadable_fix,
                              const std::string& invalid_fix);

// Recursive merge: objects merge key by key, anything else replaces.
void merge_json(nlohmann::json& base, const nlohmann::json& overlay);

}  // namespace mxtrain
