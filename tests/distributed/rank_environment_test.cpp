// Who is rank what: the precedence command line > torchrun > Slurm > Open MPI > PMI >
// SageMaker > one process, the values each source provides (Slurm's compressed node lists and
// task counts, SageMaker's resourceconfig.json), and the errors for inconsistent values.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include "mxtrain/core/error.hpp"
#include "mxtrain/runtime/rank_environment.hpp"
#include "support/test_support.hpp"

namespace mxtrain::runtime {
namespace {

EnvironmentLookup from(std::map<std::string, std::string> variables) {
  // Never the real /opt/ml: SageMaker's config folder is always a path that does not exist here
  // unless the test sets it.
  variables.emplace("SM_INPUT_CONFIG_DIR", "/nonexistent/mxtrain-test");
  return [variables](const std::string& name) -> std::optional<std::string> {
    auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
}

const std::map<std::string, std::string> kTorchrun = {
    {"RANK", "5"}, {"LOCAL_RANK", "1"}, {"WORLD_SIZE", "8"}, {"LOCAL_WORLD_SIZE", "4"},
    {"GROUP_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29600"}};
const std::map<std::string, std::string> kSlurm = {
    {"SLURM_PROCID", "6"},          {"SLURM_LOCALID", "2"},          {"SLURM_NODEID", "1"},
    {"SLURM_NTASKS", "8"},          {"SLURM_NNODES", "2"},           {"SLURM_JOB_NODELIST", "gpu[07-08]"},
    {"SLURM_TASKS_PER_NODE", "4(x2)"}, {"SLURM_JOB_ID", "4321987"},  {"SLURM_JOB_NAME", "train"}};
const std::map<std::string, std::string> kOpenMpi = {{"OMPI_COMM_WORLD_RANK", "3"},
                                                     {"OMPI_COMM_WORLD_SIZE", "4"},
                                                     {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
                                                     {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};

std::map<std::string, std::string> merged(std::initializer_list<std::map<std::string, std::string>> parts) {
  std::map<std::string, std::string> result;
  for (const auto& part : parts) result.insert(part.begin(), part.end());
  return result;
}

TEST(RankEnvironment, NothingSetIsOneProcess) {
  RankEnvironment e = resolve_rank_environment({}, from({}), 0);
  EXPECT_EQ(e.source, EnvironmentSource::single);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.master_addr, "127.0.0.1");
  EXPECT_EQ(e.master_port, 29500);
}

TEST(RankEnvironment, TorchrunVariables) {
  RankEnvironment e = resolve_rank_environment({}, from(kTorchrun), 4);
  EXPECT_EQ(e.source, EnvironmentSource::torchrun);
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.nodes, 2);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 29600);
  EXPECT_NE(e.describe().find("rank 5 of 8 (local 1 of 4, node 1 of 2) from torchrun"), std::string::npos)
      << e.describe();
}

TEST(RankEnvironment, SlurmWithNodeListAndTaskCounts) {
  RankEnvironment e = resolve_rank_environment({}, from(kSlurm), 4);
  EXPECT_EQ(e.source, EnvironmentSource::slurm);
  EXPECT_EQ(e.rank, 6);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 2);
  EXPECT_EQ(e.local_world_size, 4);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.nodes, 2);
  EXPECT_EQ(e.hosts, (std::vector<std::string>{"gpu07", "gpu08"}));
  EXPECT_EQ(e.master_addr, "gpu07");
  EXPECT_EQ(e.master_port, 15000 + 1987);  // Lightning's rule: 15000 + last four digits of the job id
  // The step's own list wins over the job's; MASTER_PORT set by the user wins over the rule.
  auto step = merged({{{"SLURM_STEP_NODELIST", "a[3-4]"}, {"MASTER_PORT", "1234"}}, kSlurm});
  RankEnvironment s = resolve_rank_environment({}, from(step), 4);
  EXPECT_EQ(s.master_addr, "a3");
  EXPECT_EQ(s.master_port, 1234);
}

TEST(RankEnvironment, SlurmAllocationWithoutSrunIsNotARank) {
  // Inside `salloc` (job name "interactive") the SLURM_* describe the allocation, not a task.
  auto shell = kSlurm;
  shell["SLURM_JOB_NAME"] = "interactive";
  EXPECT_EQ(resolve_rank_environment({}, from(shell), 0).source, EnvironmentSource::single);
}

TEST(RankEnvironment, SlurmNodeListExpansion) {
  EXPECT_EQ(expand_slurm_nodelist("gpu[01-04]"), (std::vector<std::string>{"gpu01", "gpu02", "gpu03", "gpu04"}));
  EXPECT_EQ(expand_slurm_nodelist("gpu[01-02,07],login1"),
            (std::vector<std::string>{"gpu01", "gpu02", "gpu07", "login1"}));
  EXPECT_EQ(expand_slurm_nodelist("rack[1-2]-n[8-9]"),
            (std::vector<std::string>{"rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"}));
  EXPECT_EQ(expand_slurm_nodelist("node7"), (std::vector<std::string>{"node7"}));
  EXPECT_EQ(expand_slurm_nodelist("n[9-11]"), (std::vector<std::string>{"n9", "n10", "n11"}));
  EXPECT_THROW(expand_slurm_nodelist("gpu[01-04"), Error);
  EXPECT_EQ(expand_slurm_tasks_per_node("4(x2),2"), (std::vector<int>{4, 4, 2}));
  EXPECT_EQ(expand_slurm_tasks_per_node("8"), (std::vector<int>{8}));
}

TEST(RankEnvironment, OpenMpiAndPmi) {
  RankEnvironment e = resolve_rank_environment({}, from(kOpenMpi), 2);
  EXPECT_EQ(e.source, EnvironmentSource::open_mpi);
  EXPECT_TRUE(e.started_by_mpi());
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.node_rank, 1);
  RankEnvironment p = resolve_rank_environment(
      {}, from({{"PMI_RANK", "2"}, {"PMI_SIZE", "3"}, {"MPI_LOCALRANKID", "0"}, {"MPI_LOCALNRANKS", "1"}}), 0);
  EXPECT_EQ(p.source, EnvironmentSource::pmi);
  EXPECT_EQ(p.rank, 2);
  EXPECT_EQ(p.local_world_size, 1);
  EXPECT_EQ(p.node_rank, 2);
}

TEST(RankEnvironment, SageMakerResourceConfigDescribesTheNode) {
  test::TempDir dir;
  std::ofstream(dir.file("resourceconfig.json"))
      << R"({"current_host": "algo-2", "hosts": ["algo-1", "algo-2", "algo-3"], "current_group_name": "homogeneousCluster",
            "current_instance_type": "ml.p5.48xlarge", "network_interface_name": "eth1"})";
  std::map<std::string, std::string> variables = {{"SM_INPUT_CONFIG_DIR", dir.path()}, {"SM_NUM_GPUS", "8"}};
  EnvironmentLookup lookup = [variables](const std::string& name) -> std::optional<std::string> {
    auto found = variables.find(name);
    if (found == variables.end()) return std::nullopt;
    return found->second;
  };
  RankEnvironment e = resolve_rank_environment({}, lookup, 0);
  EXPECT_EQ(e.source, EnvironmentSource::sagemaker);
  EXPECT_TRUE(e.node_level_only);
  EXPECT_EQ(e.nodes, 3);
  EXPECT_EQ(e.node_rank, 1);
  EXPECT_EQ(e.local_world_size, 8);
  EXPECT_EQ(e.world_size, 24);
  EXPECT_EQ(e.rank, 8);  // the node's first rank
  EXPECT_EQ(e.master_addr, "algo-1");
  EXPECT_EQ(e.master_port, 7777);
  EXPECT_EQ(e.network_interface, "eth1");
}

TEST(RankEnvironment, SageMakerVariablesWithoutTheFile) {
  RankEnvironment e = resolve_rank_environment(
      {}, from({{"SM_HOSTS", R"(["algo-1","algo-2"])"}, {"SM_CURRENT_HOST", "algo-1"}}), 2);
  EXPECT_EQ(e.source, EnvironmentSource::sagemaker);
  EXPECT_EQ(e.local_world_size, 2);  // SM_NUM_GPUS unset: the GPUs this process sees
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.node_rank, 0);
  EXPECT_THROW(resolve_rank_environment({}, from({{"SM_HOSTS", R"(["algo-1"])"}, {"SM_CURRENT_HOST", "algo-9"}}), 1),
               Error);
}

TEST(RankEnvironment, PrecedenceFirstMatchWins) {
  auto everything = merged({kTorchrun, kSlurm, kOpenMpi, {{"SM_HOSTS", R"(["a"])"}, {"SM_CURRENT_HOST", "a"}}});
  EXPECT_EQ(resolve_rank_environment({}, from(everything), 4).source, EnvironmentSource::torchrun);
  auto no_torchrun = merged({kSlurm, kOpenMpi, {{"SM_HOSTS", R"(["a"])"}, {"SM_CURRENT_HOST", "a"}}});
  EXPECT_EQ(resolve_rank_environment({}, from(no_torchrun), 4).source, EnvironmentSource::slurm);
  auto mpi_and_sagemaker = merged({kOpenMpi, {{"SM_HOSTS", R"(["a"])"}, {"SM_CURRENT_HOST", "a"}}});
  EXPECT_EQ(resolve_rank_environment({}, from(mpi_and_sagemaker), 4).source, EnvironmentSource::open_mpi);
  ExplicitRank cli;
  cli.rank = 1;
  cli.world_size = 2;
  cli.master_addr = "10.1.2.3";
  RankEnvironment e = resolve_rank_environment(cli, from(everything), 4);
  EXPECT_EQ(e.source, EnvironmentSource::command_line);
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.master_addr, "10.1.2.3");
  EXPECT_EQ(e.master_port, 29600);  // not given on the command line: MASTER_PORT
}

TEST(RankEnvironment, InconsistentValuesNameTheVariables) {
  auto bad = kTorchrun;
  bad["RANK"] = "8";
  try {
    resolve_rank_environment({}, from(bad), 4);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::config);
    EXPECT_NE(error.full_message().find("rank 8 is not in [0, 8)"), std::string::npos) << error.full_message();
    EXPECT_NE(error.full_message().find("RANK, WORLD_SIZE"), std::string::npos) << error.full_message();
  }
  bad = kTorchrun;
  bad["WORLD_SIZE"] = "eight";
  EXPECT_THROW(resolve_rank_environment({}, from(bad), 4), Error);
  ExplicitRank half;
  half.rank = 0;
  EXPECT_THROW(resolve_rank_environment(half, from({}), 0), Error);
}

TEST(RankEnvironment, DeviceIndexFollowsTheLocalRank) {
  RankEnvironment e = resolve_rank_environment({}, from(kTorchrun), 4);
  EXPECT_EQ(local_device_index(e, 4), 1);
  EXPECT_EQ(local_device_index(e, 1), 0);  // srun --gpus-per-task: each rank sees its own GPU as 0
  e.local_rank = 3;
  EXPECT_THROW(local_device_index(e, 2), Error);
}

}  // namespace
}  // namespace mxtrain::runtime
