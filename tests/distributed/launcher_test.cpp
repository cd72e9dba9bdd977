// `mxtrain launch` as a process: the rank variables each child sees; a rank that dies ends the
// job, is named with its last log lines, and takes the others down (SIGTERM, then SIGKILL for
// one that ignores it); CPU ranks without MPI are refused with the mpirun command to use.
#include <gtest/gtest.h>

#include <cerrno>
#include <csignal>
#include <fstream>

#include "distributed/process_helpers.hpp"
#include "mxtrain/distributed/communicator_factory.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

TEST(Launcher, EachRankGetsTheTorchrunVariables) {
  test::TempDir dir;
  const std::string command =
      test::binary_path() + " launch --nproc-per-node 3 --nnodes 2 --node-rank 1 --master-addr 10.0.0.7 "
      "--master-port 29911 --log-dir " + dir.file("logs") + " --exec -- sh -c 'echo \"$RANK $LOCAL_RANK "
      "$WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $NCCL_NVLS_ENABLE\" > " + dir.path() +
      "/rank_$RANK.txt; echo hello from $RANK'";
  std::string output;
  ASSERT_EQ(test::run_command(command, &output), 0) << output;
  EXPECT_EQ(read_file(dir.file("rank_3.txt")), "3 0 6 3 1 10.0.0.7 29911 0\n");
  EXPECT_EQ(read_file(dir.file("rank_4.txt")), "4 1 6 3 1 10.0.0.7 29911 0\n");
  EXPECT_EQ(read_file(dir.file("rank_5.txt")), "5 2 6 3 1 10.0.0.7 29911 0\n");
  EXPECT_NE(output.find("[rank 4] hello from 4"), std::string::npos) << output;
  EXPECT_NE(output.find("all 3 rank(s) finished"), std::string::npos) << output;
  EXPECT_EQ(read_file(dir.file("logs/rank_00005.log")), "hello from 5\n");
  // A value the user set is kept.
  ASSERT_EQ(test::run_command("NCCL_NVLS_ENABLE=1 " + test::binary_path() + " launch --nproc-per-node 1 --log-dir " +
                                  dir.file("logs") + " --exec -- sh -c 'echo nvls=$NCCL_NVLS_ENABLE'",
                              &output),
            0);
  EXPECT_NE(output.find("nvls=1"), std::string::npos) << output;
}

TEST(Launcher, ADeadRankEndsTheJobAndIsNamedWithItsLastLines) {
  test::TempDir dir;
  // Rank 1 fails after a second; rank 0 waits normally; rank 2 ignores SIGTERM.
  const std::string script =
      "echo rank $RANK up; echo $$ > " + dir.path() + "/pid_$RANK; "
      "if [ $RANK = 1 ]; then sleep 1; echo last words of rank 1; echo boom >&2; exit 7; fi; "
      "if [ $RANK = 2 ]; then trap \"\" TERM; while true; do sleep 0.1; done; fi; exec sleep 60";
  test::BackgroundProcess launcher(test::binary_path() + " launch --nproc-per-node 3 --kill-timeout 2 --log-dir " +
                                       dir.file("logs") + " --exec -- sh -c '" + script + "'",
                                   dir.file("output.txt"));
  std::optional<int> status = launcher.wait(30);
  ASSERT_TRUE(status.has_value()) << "the launcher did not end the job:\n" << launcher.output();
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 7);
  const std::string output = launcher.output();
  EXPECT_NE(output.find("rank 1 (local rank 1 on node 0, pid"), std::string::npos) << output;
  EXPECT_NE(output.find("exited with status 7"), std::string::npos) << output;
  EXPECT_NE(output.find("    last words of rank 1\n    boom"), std::string::npos) << output;
  EXPECT_NE(output.find(dir.file("logs/rank_00001.log")), std::string::npos) << output;
  EXPECT_NE(output.find("sending SIGKILL"), std::string::npos) << output;
  for (int rank : {0, 2}) {
    const std::string pid_text = read_file(dir.file("pid_" + std::to_string(rank)));
    ASSERT_FALSE(pid_text.empty()) << "rank " << rank << " never started";
    EXPECT_FALSE(process_exists(static_cast<pid_t>(std::stoi(pid_text)))) << "rank " << rank << " survived";
  }
}

TEST(Launcher, CpuRanksWithoutMpiAreRefusedWithTheMpirunCommand) {
  if (visible_gpu_count() > 0) GTEST_SKIP() << "this machine has GPUs, so launch would start GPU ranks";
  std::string output;
  EXPECT_NE(test::run_command(test::binary_path() + " launch --nproc-per-node 2 -- train", &output), 0);
  EXPECT_NE(output.find("mpirun -np 2 mxtrain train"), std::string::npos) << output;
  // Started by hand with torchrun-style variables, a CPU rank says the same.
  EXPECT_NE(test::run_command("RANK=0 WORLD_SIZE=2 " + test::binary_path() + " train -d cpu --steps 1", &output), 0);
  EXPECT_NE(output.find("mpirun -np 2"), std::string::npos) << output;
}

TEST(Launcher, NothingToLaunchIsAUsageError) {
  std::string output;
  EXPECT_NE(test::run_command(test::binary_path() + " launch --nproc-per-node 1", &output), 0);
  EXPECT_NE(output.find("command"), std::string::npos) << output;
}

}  // namespace
}  // namespace mxtrain
