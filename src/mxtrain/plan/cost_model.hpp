// Prices a traced step on a GPU model. Each recorded op costs a launch overhead for each GPU
// operation the cuda backend issues for it (gpu_launches) plus:
//   GEMM (linear ops)      flops / (peak(dtype) · gemm_efficiency(m, n, k)), at least its bytes
//                          over the achievable bandwidth;
//   attention              flops / (peak · fraction · s/(s + s½) · d/(d + d½)), idem;
//   everything else        bytes / (HBM bandwidth · bandwidth fraction) (host copies: PCIe).
// Ops in the recompute phase are reported as recompute, the optimizer phase as optimizer.
// Collectives cost bytes over the link bandwidth of their group (NVLink inside a node, the NIC
// across nodes) plus latency. The recorded step is replayed with the FSDP schedule's own
// dependencies (each collective starts when issued, compute waits where the store waits), so
// exposed communication = replayed step time - compute time.
#pragma once
#include "mxtrain/plan/calibration.hpp"
#include "mxtrain/hw/gpu_catalog.hpp"
#include "mxtrain/plan/step_trace.hpp"

namespace mxtrain {

struct StepTime {
  double gemm_s = 0;                     // forward and backward GEMMs (not recompute)
  double attention_s = 0;                // flash attention forward and backward (not recompute)
  double memory_bound_s = 0;             // norms, activations, RoPE, loss, embedding, copies
  double recompute_s = 0;                // everything rerun by activation checkpointing
  double optimizer_s = 0;                // gradient norm, AdamW, zeroing
  double communication_s = 0;            // all collectives of the step
  double communication_exposed_s = 0;    // the part the schedule cannot overlap with compute
  double launch_s = 0;                   // launch overhead, included in the compute terms above
  // The same ops by class whatever their phase, launch overhead excluded (for calibration fits).
  double gemm_class_s = 0, attention_class_s = 0, memory_class_s = 0;
  double ops = 0;                        // GPU operations launched in the step (gpu_launches)
  double compute_s() const { return gemm_s + attention_s + memory_bound_s + recompute_s + optimizer_s; }
  double total_s = 0;                    // compute + exposed communication, times step_time_scale
};

// Fraction of the dense peak a GEMM of output m x n and depth k reaches (best tile).
double gemm_efficiency(int64_t m, int64_t n, int64_t k, const GpuSpec& gpu, const GpuCalibration& calibration);
// GPU operations (kernels, memsets) the cuda backend launches for one op of this kind.
double gpu_launches(OpKind kind);
// Seconds of one op, launch overhead included.
// flash_attention_4: the attention backward is FlashAttention-4's (train.attention_backward).
double op_seconds(const OpRecord& op, const GpuSpec& gpu, const GpuCalibration& calibration, bool tf32,
                  bool flash_attention_4 = false);
// Where the ranks of a run sit.
struct Topology {
  int gpus_per_node = 8;
  int nodes = 1;
};

// Seconds of one collective.
double collective_seconds(const CollectiveRecord& collective, const GpuSpec& gpu, const GpuCalibration& calibration,
                          const Topology& topology);

// The step of `trace` with its real number of micro-batches.
StepTime price_step(const StepTrace& trace, const GpuSpec& gpu, const GpuCalibration& calibration,
                    const Topology& topology);

}  // namespace mxtrain
