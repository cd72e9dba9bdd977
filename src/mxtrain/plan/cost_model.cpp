#include "mxtrain/plan/cost_model.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "mxtrain/core/error.hpp"

namespace mxtrain {
namespace {

double ceil_div(double a, double b) { return std::ceil(a / b); }

bool is_gemm(OpKind kind) {
  return kind == OpKind::linear_forward || kind == OpKind::linear_backward_input ||
         kind == OpKind::linear_backward_weight;
}
bool is_attention(OpKind kind) { return kind == OpKind::attention_forward || kind == OpKind::attention_backward; }

}  // namespace

double gpu_launches(OpKind kind) {
  // What the cuda backend issues per op, from a CUPTI trace of a step (bench/cupti_trace.cpp):
  // cuBLASLt and cuDNN clear a 4-byte tile counter before each kernel (llama-1b 8x2048: 271
  // memsets for 270 GEMMs), cuDNN's backward adds its dO·O and dQ-conversion kernels, and the
  // deterministic reductions (column sums, norm weight gradients, sums) finish in a second
  // kernel.
  switch (kind) {
    case OpKind::linear_forward:
    case OpKind::linear_backward_input:
    case OpKind::linear_backward_weight:
    case OpKind::attention_forward:
    case OpKind::norm_backward:
    case OpKind::sum:
    case OpKind::sum_of_squares:
    case OpKind::column_sum:
    case OpKind::qkv_bias_gradient: return 2;
    case OpKind::attention_backward: return 4;
    default: return 1;
  }
}

namespace {

// A GEMM epilogue's own traffic (OpRecord::epilogue_bytes) at the achievable bandwidth: it
// follows each tile's math instead of hiding under it (measured on an H200, GELU_AUX and DGELU
// added about their bytes' time at full bandwidth to GPT-2 1.5B's GEMMs).
double epilogue_seconds(const OpRecord& op, const GpuSpec& gpu, const GpuCalibration& calibration) {
  return op.epilogue_bytes / (gpu.hbm_bytes_per_s * calibration.bandwidth_fraction);
}

}  // namespace

double gemm_efficiency(int64_t m, int64_t n, int64_t k, const GpuSpec& gpu, const GpuCalibration& calibration) {
  if (m <= 0 || n <= 0 || k <= 0) return calibration.gemm_peak_fraction;
  const double sms = std::max(1, gpu.multiprocessors);
  double best = 0;
  for (const GemmTile& tile : calibration.gemm_tiles) {
    // Output tiles run in waves of one tile per SM; a partial last wave and partial edge tiles
    // leave tensor cores idle. Too few tiles for the SMs: split k into slices (split-K), each
    // at least gemm_split_k_min deep, at the cost of a reduction.
    const double tiles = ceil_div(static_cast<double>(m), static_cast<double>(tile.m)) *
                         ceil_div(static_cast<double>(n), static_cast<double>(tile.n));
    for (double split = 1; split == 1 || (tiles * split <= sms && static_cast<double>(k) / split >= calibration.gemm_split_k_min);
         split *= 2) {
      const double waves = ceil_div(tiles * split, sms);
      const double utilisation = static_cast<double>(m) * static_cast<double>(n) * split /
                                 (waves * sms * static_cast<double>(tile.m) * static_cast<double>(tile.n));
      const double penalty = split > 1 ? calibration.gemm_split_k_efficiency : 1.0;
      best = std::max(best, utilisation * tile.efficiency * penalty);
    }
  }
  // A short inner dimension cannot amortise loading the tile's operands.
  const double depth = static_cast<double>(k) / (static_cast<double>(k) + calibration.gemm_k_half);
  return calibration.gemm_peak_fraction * best * depth;
}

// The fraction of HBM bandwidth an op's memory traffic runs at: the block formats' casts their own.
static double bandwidth_fraction(const OpRecord& op, const GpuCalibration& calibration) {
  if (op.kind == OpKind::quantize || op.kind == OpKind::dequantize) {
    if (op.format == DType::e8m0 && calibration.mxfp8_cast_fraction > 0) return calibration.mxfp8_cast_fraction;
    if (op.format == DType::e2m1 && calibration.nvfp4_cast_fraction > 0) return calibration.nvfp4_cast_fraction;
  }
  return calibration.bandwidth_fraction;
}

double op_seconds(const OpRecord& op, const GpuSpec& gpu, const GpuCalibration& calibration, bool tf32,
                  bool flash_attention_4) {
  const double bandwidth = gpu.hbm_bytes_per_s * bandwidth_fraction(op, calibration);
  const double memory_s = op.bytes / bandwidth;
  double seconds = memory_s;
  if (is_gemm(op.kind)) {
    const double peak = gemm_peak_flops(gpu, op.dtype, tf32);
    MXTRAIN_ASSERT(peak > 0, "no GEMM peak for %s on %s", std::string(dtype_name(op.dtype)).c_str(), gpu.key.c_str());
    seconds = std::max(memory_s, op.flops / (peak * gemm_efficiency(op.m, op.n, op.k, gpu, calibration))) +
              epilogue_seconds(op, gpu, calibration);
  } else if (is_attention(op.kind)) {
    // Flash attention runs on the bf16 tensor cores whatever the activations (f32 is staged).
    const double peak = gpu.bf16_flops;
    const double seq = static_cast<double>(op.n), head_dim = static_cast<double>(op.k);
    const bool fa4 = flash_attention_4 && op.kind == OpKind::attention_backward;
    const double fraction = op.kind == OpKind::attention_forward ? calibration.attention_forward_fraction
                            : fa4 ? calibration.attention_backward_fraction * calibration.flash_attention_4_backward_gain
                                  : calibration.attention_backward_fraction;
    const double head_dim_half =
        fa4 ? calibration.flash_attention_4_head_dim_half : calibration.attention_head_dim_half;
    const double efficiency =
        fraction * seq / (seq + calibration.attention_seq_half) * head_dim / (head_dim + head_dim_half);
    seconds = std::max(memory_s, op.flops / (peak * efficiency));
  } else if (op.kind == OpKind::copy_from_host || op.kind == OpKind::copy_to_host) {
    seconds = op.bytes / calibration.host_to_device_bytes_per_s;
  }
  return seconds + calibration.launch_overhead_s * gpu_launches(op.kind);
}

double collective_seconds(const CollectiveRecord& collective, const GpuSpec& gpu, const GpuCalibration& calibration,
                          const Topology& topology) {
  const double ranks = collective.group_size;
  if (ranks <= 1 || collective.kind == CollectiveKind::barrier) return calibration.collective_latency_s;
  // Groups wider than a node cross it; replica groups (same slice, different shard groups) span
  // the nodes whenever there are several.
  const bool crosses_nodes = collective.group_size > topology.gpus_per_node ||
                             (collective.group == "replicate" && topology.nodes > 1);
  const double link = crosses_nodes ? gpu.internode_bytes_per_s * calibration.internode_fraction
                                    : gpu.nvlink_bytes_per_s * calibration.nvlink_fraction;
  // Ring algorithms: each rank sends (ranks-1)/ranks of the full buffer once (all-gather,
  // reduce-scatter, broadcast pipelined) or twice (all-reduce).
  double traffic = static_cast<double>(collective.bytes) * (ranks - 1) / ranks;
  if (collective.kind == CollectiveKind::all_reduce) traffic *= 2;
  return traffic / link + calibration.collective_latency_s * std::log2(ranks);
}

namespace {

// Replays the recorded step: ops run one after another on the compute stream; collectives run
// in issue order on one link (each starts once issued and the link is free); a wait holds
// compute until that collective, and the earlier ones of its communicator, finished.
struct Replay {
  double end_s = 0;
  double micro_batch_start_s[2] = {0, 0};
};

Replay replay(const StepTrace& trace, const GpuSpec& gpu, const GpuCalibration& calibration, const Topology& topology) {
  Replay result;
  double compute = 0, link = 0;
  std::map<int, std::vector<std::pair<uint64_t, double>>> finish;  // per communicator: (id, end), ids ascending
  for (const TimelineEvent& event : trace.timeline) {
    switch (event.kind) {
      case TimelineEvent::Kind::op: compute += op_seconds(event.op, gpu, calibration, trace.tf32, trace.flash_attention_4_backward); break;
      case TimelineEvent::Kind::issue: {
        link = std::max(compute, link) + collective_seconds(event.collective, gpu, calibration, topology);
        finish[event.channel].emplace_back(event.id, link);
        break;
      }
      case TimelineEvent::Kind::wait:
        for (const auto& [id, end] : finish[event.channel])
          if (id <= event.id) compute = std::max(compute, end);
        break;
      case TimelineEvent::Kind::micro_batch:
        if (event.micro_batch >= 0 && event.micro_batch < 2) result.micro_batch_start_s[event.micro_batch] = compute;
        break;
    }
  }
  result.end_s = compute;
  return result;
}

}  // namespace

StepTime price_step(const StepTrace& trace, const GpuSpec& gpu, const GpuCalibration& calibration,
                    const Topology& topology) {
  StepTime time;
  // The non-final micro-batch stands for A - 1 of them (its slot is empty when A = 1).
  MXTRAIN_ASSERT(trace.traced_micro_batches == std::min<int64_t>(trace.micro_batches, 2), "trace micro-batches");
  const double repeat[kStepSlotCount] = {1, static_cast<double>(trace.micro_batches - 1), 1};
  for (int slot = 0; slot < kStepSlotCount; ++slot) {
    for (const OpCount& entry : trace.ops[slot]) {
      const OpRecord& op = entry.op;
      const double count = static_cast<double>(entry.count) * repeat[slot];
      const double seconds = op_seconds(op, gpu, calibration, trace.tf32, trace.flash_attention_4_backward) * count;
      const double launches = gpu_launches(op.kind) * count;
      time.launch_s += calibration.launch_overhead_s * launches;
      time.ops += launches;
      // A GEMM epilogue's extra traffic is memory-bound work (its class scales with bandwidth).
      const double epilogue = epilogue_seconds(op, gpu, calibration) * count;
      const double work = seconds - calibration.launch_overhead_s * launches - epilogue;
      (is_gemm(op.kind) ? time.gemm_class_s : is_attention(op.kind) ? time.attention_class_s : time.memory_class_s) += work;
      time.memory_class_s += epilogue;
      if (op.phase == Phase::recompute) time.recompute_s += seconds;
      else if (op.phase == Phase::optimizer) time.optimizer_s += seconds;
      else if (is_gemm(op.kind)) time.gemm_s += seconds;
      else if (is_attention(op.kind)) time.attention_s += seconds;
      else time.memory_bound_s += seconds;
    }
    for (const CollectiveCount& entry : trace.collectives[slot])
      time.communication_s += collective_seconds(entry.collective, gpu, calibration, topology) *
                              static_cast<double>(entry.count) * repeat[slot];
  }
  // The traced step holds min(A, 2) micro-batches; each further one repeats the first.
  const Replay traced = replay(trace, gpu, calibration, topology);
  double elapsed = traced.end_s;
  if (trace.traced_micro_batches == 2)
    elapsed += static_cast<double>(trace.micro_batches - 2) *
               (traced.micro_batch_start_s[1] - traced.micro_batch_start_s[0]);
  time.communication_exposed_s = std::max(0.0, elapsed - time.compute_s());
  time.total_s = (time.compute_s() + time.communication_exposed_s) * calibration.step_time_scale;
  return time;
}

}  // namespace mxtrain
