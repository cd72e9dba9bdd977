// Where the bytes are at the peak. Everything inside the allocator comes from its live buffers at
// the moment live bytes peaked (named and typed by the model's one memory table: the Lifetime and
// the buffer name); what the allocator cannot see — the CUDA context and library handles, NCCL's
// own buffers — comes from calibration. The parts inside the allocator add up to its peak live
// bytes exactly; "peak vs capacity" is the allocator's reserved peak plus the outside parts.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mxtrain/plan/calibration.hpp"
#include "mxtrain/plan/step_trace.hpp"

namespace mxtrain {

struct NamedBytes {
  std::string name;
  uint64_t bytes = 0;
  int64_t buffers = 0;
};

// Consecutive layers [first, last] that each hold `bytes_per_layer` of saved activations.
struct LayerRun {
  int64_t first = 0, last = 0;
  uint64_t bytes_per_layer = 0;
};

struct MemoryBreakdown {
  // Inside the allocator, live at the peak.
  uint64_t weights = 0;            // compute-precision weights (gathered or local)
  uint64_t master_weights = 0;     // FP32 masters
  uint64_t gradients = 0;
  uint64_t optimizer_states = 0;
  uint64_t quantized_copies = 0;   // low-precision weight copies of the precision recipe
  uint64_t layer_activations = 0;  // saved activations of the transformer blocks
  std::vector<LayerRun> per_layer;
  uint64_t other_activations = 0;  // embedding output, final norm, ...
  uint64_t logits = 0;             // the logits chunk of the loss
  uint64_t scratch = 0;            // other temporaries live at the peak
  uint64_t data = 0;               // token batch
  uint64_t library_workspaces = 0; // cuBLASLt, cuDNN, RoPE tables, reduction partials
  uint64_t communication_buffers = 0;  // FSDP gather/reduce buffers
  uint64_t peak_live = 0;
  uint64_t peak_reserved = 0;
  uint64_t fragmentation = 0;      // reserved - live at the peak: the caching allocator's margin
  // Outside the allocator (calibration).
  uint64_t cuda_context = 0;
  uint64_t nccl_buffers = 0;      // per communicator the store creates
  uint64_t total = 0;              // peak_reserved + cuda_context + nccl_buffers
  uint64_t capacity = 0;
  bool detailed = false;           // per-buffer data available (per_layer, logits, by_name)
  std::vector<NamedBytes> by_lifetime;
  std::vector<NamedBytes> by_name;  // layer index replaced by '*', largest first
  std::string peak_at;              // "backward, layers.21, micro-batch 1 of step 1"

  double headroom_fraction() const {
    return capacity ? 1.0 - static_cast<double>(total) / static_cast<double>(capacity) : 0.0;
  }
};

// group_names[g] names parameter group g ("embed", "layers.3", "head").
MemoryBreakdown memory_breakdown(const StepTrace& trace, const GpuCalibration& calibration, uint64_t capacity_bytes,
                                 const std::vector<std::string>& group_names);

// "layers.12.mlp_up" -> "layers.*.mlp_up"; other names unchanged.
std::string name_pattern(const std::string& name);

}  // namespace mxtrain
