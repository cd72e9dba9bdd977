// Runs the real training step — TrainingSession::step with the real Transformer, recompute
// policy, precision and parameter store — on the dryrun backend and records what it did: every
// op (aggregated by shape), every collective, and the allocator's state at the peak.
//
// Micro-batches of one step are identical, so a step with A micro-batches is traced with
// min(A, 2) of them: the first stands for every non-final one, the last for the final one, and
// the time of A is extrapolated exactly (plan/cost_model). Nothing here is O(parameters) on the
// host: the dryrun allocates fake addresses and its ops compute nothing.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mxtrain/backend/allocator.hpp"
#include "mxtrain/backend/backend.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/distributed/communicator.hpp"
#include "mxtrain/plan/calibration.hpp"

namespace mxtrain {

// Where in a step an op ran: outside the micro-batches (loss reset, optimizer), in a non-final
// micro-batch, or in the final one.
enum class StepSlot : uint8_t { outside, non_final_micro_batch, final_micro_batch };
constexpr int kStepSlotCount = 3;

struct OpCount {
  OpRecord op;
  int64_t count = 0;
};

struct CollectiveCount {
  CollectiveRecord collective;
  int64_t count = 0;
};

// The recorded step in issue order, for replaying compute against communication.
struct TimelineEvent {
  enum class Kind : uint8_t { op, issue, wait, micro_batch };
  Kind kind = Kind::op;
  OpRecord op{};                 // op
  CollectiveRecord collective{}; // issue
  int channel = 0;               // issue, wait: which communicator
  uint64_t id = 0;               // issue, wait: the collective's id on that communicator
  int micro_batch = -1;          // micro_batch: the index that begins here
};

// The allocator at the moment live bytes peaked (first time the maximum was reached).
struct PeakSnapshot {
  size_t live_bytes = 0;
  size_t live_by_lifetime[kLifetimeCount] = {};
  std::vector<CachingAllocator::LiveEntry> entries;  // empty unless a detailed trace
  Phase phase = Phase::other;
  int micro_batch = -1;  // -1: outside the micro-batches
  int group = -1;        // the parameter group last acquired (layer l is group l + 1)
  int step = 0;          // 1-based
  uint64_t allocation_index = 0;  // allocations observed before and including the peak one
};

struct TraceRequest {
  RunConfig config;              // model, train (micro-batch, sequence, recompute, precision), dist
  int world_size = 1;
  int gpus_per_node = 8;         // hybrid_shard's default shard group
  GpuCalibration calibration;    // its cuda_allocations replay backend/cuda's in-op allocations
  std::string device_label;      // e.g. "h200"
  int compute_capability = 0;    // the GPU's (90: Hopper, where quack's gated GEMM runs); 0 = none
  std::vector<DType> native_quantized_gemms;  // GEMM formats the GPU runs natively (the rest emulated)
  size_t capacity_bytes = 0;     // the simulated allocator's limit; 0 = unlimited
  int steps = 2;                 // the first step warms the allocator's cache; ops come from the last
  bool detailed_peak = true;     // also list every live buffer at the peak (a second, identical dryrun)
};

struct StepTrace {
  int64_t micro_batches = 1;         // per step on this rank (gradient accumulation)
  int64_t traced_micro_batches = 1;  // min(micro_batches, 2)
  std::vector<OpCount> ops[kStepSlotCount];
  std::vector<CollectiveCount> collectives[kStepSlotCount];
  std::vector<TimelineEvent> timeline;  // the last step
  int communicators = 0;             // communicators the store created (NCCL buffers each)
  MemoryStats memory;                // allocator stats after the last step (peaks over all of them)
  PeakSnapshot peak;
  std::string precision;             // resolved precision name
  DType activation_dtype = DType::bf16;
  DType mfu_dtype = DType::bf16;     // whose dense peak MFU is against (train/precision.hpp)
  bool tf32 = false;
  bool flash_attention_4_backward = false;  // train.attention_backward = flash-attention-4
  double dryrun_seconds = 0;         // host time the dryrun(s) took
};

// Throws Error(out_of_memory) when capacity_bytes is set and the step does not fit in it.
StepTrace trace_step(const TraceRequest& request);

// Sum of flops of the ops in a slot that satisfy `pred`, times their counts (tests, reports).
template <typename Pred>
double traced_flops(const StepTrace& trace, StepSlot slot, Pred pred) {
  double total = 0;
  for (const OpCount& entry : trace.ops[static_cast<int>(slot)])
    if (pred(entry.op)) total += entry.op.flops * static_cast<double>(entry.count);
  return total;
}

}  // namespace mxtrain
