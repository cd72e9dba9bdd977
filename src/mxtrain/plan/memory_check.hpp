// Before a CPU training run allocates anything: the planner's dryrun of the very step the run
// will take (plan/step_trace: the real session on the dryrun backend, with the CPU's precision)
// gives one rank's peak bytes; the ranks on this host need that many times over, and the run
// stops with that figure and its fix when the host has less available (core/host_memory). The
// alternative is no message at all: Linux overcommits, so the kernel kills the process (exit 137)
// while it touches the pages. (A CUDA run needs little host memory; its device allocations fail
// cleanly in the caching allocator with the same kind of message.)
#pragma once
#include <cstdint>

#include "mxtrain/config/run_config.hpp"

namespace mxtrain {

struct HostMemoryNeed {
  uint64_t per_rank_bytes = 0;  // the dryrun's peak reserved bytes of one rank
  uint64_t total_bytes = 0;     // per_rank_bytes x ranks on this host
  int ranks_on_host = 1;
};

// The bytes a CPU run of `config` over `world_size` ranks allocates on this host.
HostMemoryNeed cpu_training_memory_need(const RunConfig& config, int world_size, int ranks_on_host);

// Throws Error(out_of_memory) naming the need and `available_bytes` when the need is larger.
// available_bytes = 0 (unknown) passes.
void check_cpu_training_memory(const RunConfig& config, int world_size, int ranks_on_host, uint64_t available_bytes);

}  // namespace mxtrain
