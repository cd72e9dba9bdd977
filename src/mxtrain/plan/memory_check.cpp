#include "mxtrain/plan/memory_check.hpp"

#include "mxtrain/core/checked.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/plan/planner.hpp"
#include "mxtrain/plan/step_trace.hpp"
#include "mxtrain/train/precision.hpp"

namespace mxtrain {

HostMemoryNeed cpu_training_memory_need(const RunConfig& config, int world_size, int ranks_on_host) {
  TraceRequest request;
  request.config = config;
  // The trainer's precision on the CPU (auto = fp32), quantized formats emulated as there.
  request.config.train.precision = resolve_precision(config.train.precision, "cpu", config.train.tf32).name;
  request.world_size = world_size;
  request.gpus_per_node = ranks_on_host;
  request.device_label = "cpu";
  request.steps = 2;  // the first step fills the allocator's cache; the peak is over both
  request.detailed_peak = false;
  const StepTrace trace = trace_step(request);
  HostMemoryNeed need;
  need.per_rank_bytes = trace.memory.peak_reserved_bytes;
  need.ranks_on_host = ranks_on_host;
  need.total_bytes = static_cast<uint64_t>(
      checked_mul(static_cast<int64_t>(need.per_rank_bytes), ranks_on_host, "the host memory of the ranks"));
  return need;
}

void check_cpu_training_memory(const RunConfig& config, int world_size, int ranks_on_host, uint64_t available_bytes) {
  if (available_bytes == 0) return;
  const HostMemoryNeed need = cpu_training_memory_need(config, world_size, ranks_on_host);
  if (need.total_bytes <= available_bytes) return;
  const std::string ranks =
      ranks_on_host == 1 ? std::string() : strf(" (%s per rank x %d ranks on this host)", gib_text(need.per_rank_bytes).c_str(),
                                                ranks_on_host);
  throw Error(ErrorKind::out_of_memory,
              "this run needs " + gib_text(static_cast<double>(need.total_bytes)) + " of host memory" + ranks +
                  " for weights, gradients, optimizer states and activations, but the machine has " +
                  gib_text(static_cast<double>(available_bytes)) + " available (MemAvailable in /proc/meminfo)",
              "lower train.micro_batch_size or train.seq_len, use a smaller model (model.layers, model.hidden), "
              "turn on activation checkpointing (--recompute full), or run fewer ranks on this host; `mxtrain plan` "
              "with the same config shows where the memory goes");
}

}  // namespace mxtrain
