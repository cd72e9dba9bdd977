// Which rank this process is, read from whatever started it. Precedence, first match wins
// (docs/distributed.md, "Precedence"): explicit command-line flags > torchrun (RANK and
// WORLD_SIZE; also what `mxtrain launch` sets) > Slurm srun (SLURM_PROCID, SLURM_NTASKS) >
// Open MPI (OMPI_COMM_WORLD_*) > MPICH/Hydra PMI (PMI_RANK, PMI_SIZE) > SageMaker
// (resourceconfig.json or SM_HOSTS/SM_CURRENT_HOST) > a single process.
//
// SageMaker describes a node, not a process: the result has node_level_only set, and whoever
// reads it (`mxtrain train` or `mxtrain launch`) starts local_world_size ranks on this node.
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace mxtrain::runtime {

enum class EnvironmentSource : uint8_t { command_line, torchrun, slurm, open_mpi, pmi, sagemaker, single };
const char* environment_source_name(EnvironmentSource source);

struct RankEnvironment {
  EnvironmentSource source = EnvironmentSource::single;
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  int node_rank = 0, nodes = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  bool node_level_only = false;     // SageMaker: ranks of this node are still to be started
  std::vector<std::string> hosts;   // Slurm node list or SageMaker hosts, when known
  std::string network_interface;    // SageMaker's network_interface_name (for NCCL_SOCKET_IFNAME)
  bool started_by_mpi() const {
    return source == EnvironmentSource::open_mpi || source == EnvironmentSource::pmi;
  }
  // "rank 1 of 8 (local 1 of 4, node 0 of 2) from torchrun; master 10.0.0.1:29500"
  std::string describe() const;
};

// Values given on the command line (`mxtrain train --rank ...`); -1 / "" = not given.
struct ExplicitRank {
  int rank = -1, world_size = -1, local_rank = -1, local_world_size = -1, master_port = -1;
  std::string master_addr;
  bool any() const {
    return rank >= 0 || world_size >= 0 || local_rank >= 0 || local_world_size >= 0 || master_port >= 0 ||
           !master_addr.empty();
  }
};

// A variable's value, or nothing when unset. Production reads the process environment; tests
// pass a map.
using EnvironmentLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvironmentLookup process_environment();

// visible_gpus: GPUs this process sees (SageMaker's rank count per node when SM_NUM_GPUS is
// unset). Throws Error(config) for inconsistent values, naming the variables and the fix.
RankEnvironment resolve_rank_environment(const ExplicitRank& explicit_rank, const EnvironmentLookup& lookup,
                                         int visible_gpus);

// Slurm's compressed host lists: "gpu[01-04,07],login1" -> gpu01 gpu02 gpu03 gpu04 gpu07 login1.
std::vector<std::string> expand_slurm_nodelist(const std::string& list);
// Slurm's tasks per node: "4(x2),2" -> 4 4 2.
std::vector<int> expand_slurm_tasks_per_node(const std::string& text);

// The CUDA device a rank uses: its local rank, or 0 when the launcher already narrowed
// CUDA_VISIBLE_DEVICES to one GPU per rank (srun --gpus-per-task). Throws when the node has
// fewer GPUs than local ranks.
int local_device_index(const RankEnvironment& environment, int visible_gpus);

}  // namespace mxtrain::runtime
