// A one-shot broadcast over TCP at start-up, without MPI: rank 0 listens on master_port and
// hands the same bytes (the NCCL unique id) to each of the other world_size - 1 ranks, which
// connect to master_addr:master_port. Each peer announces its rank and the world size, so a
// rank from another job or a different world size is refused with a clear error.
#pragma once
#include <string>

#include "mxtrain/runtime/rank_environment.hpp"

namespace mxtrain::runtime {

// Returns rank 0's `payload` on every rank. Throws Error(system) naming the address, the ranks
// still missing at the timeout, and the fix.
std::string tcp_broadcast_from_rank0(const RankEnvironment& environment, const std::string& payload,
                                     double timeout_s = 300);

// Whether this host can listen on `port` right now (the launcher checks before starting ranks).
bool tcp_port_is_free(int port);

}  // namespace mxtrain::runtime
