// Which communicator a run uses, and how it starts. dist.backend = auto picks NCCL on GPUs and
// Open MPI on CPUs (a single-process communicator for one rank). NCCL's unique id reaches the
// other ranks through NCCL_COMM_ID when set (every rank derives it), through MPI when mpirun
// started the ranks, and otherwise over TCP from rank 0 at MASTER_ADDR:MASTER_PORT.
//
// CPU ranks have no collectives without MPI: several CPU ranks must be started by mpirun
// (`mxtrain launch` starts GPU ranks). That is the one combination refused here, with the fix.
#pragma once
#include <memory>
#include <string>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/distributed/communicator.hpp"
#include "mxtrain/runtime/rank_environment.hpp"

namespace mxtrain {

// "single", "nccl" or "mpi" for dist.backend on `device` ("cpu" or "cuda") with this many ranks.
// Throws Error(config) for a combination that cannot work.
std::string resolve_communicator_kind(const std::string& requested, const std::string& device, int world_size);

// The world communicator of this rank (collective: every rank of the environment calls it).
std::unique_ptr<Communicator> create_world_communicator(const std::string& kind,
                                                        const runtime::RankEnvironment& environment,
                                                        Backend& backend);

// Ends what the process started for communication (MPI_Finalize) after a successful run; a
// failed rank skips it so that mpirun ends the job (see dist/mpi/mpi_communicator.hpp).
void finish_communication();

// CUDA GPUs this process can see (0 in a build without CUDA or on a machine without a GPU).
int visible_gpu_count();

}  // namespace mxtrain
