// Stop safety of a real multi-process job under mpirun: SIGTERM to one rank (as Slurm or
// SageMaker deliver it) stops every rank at the same step with a checkpoint and exit 0, and the
// continuation equals an uninterrupted run; SIGKILL of rank 0 while a checkpoint is half written
// leaves the previous checkpoint as the one that loads; a checkpoint write that fails on rank 1
// alone (its file size limit, as a full disk on its node) stops every rank, each naming rank 1,
// and so does a checkpoint directory rank 1 cannot write at start-up, before the first step.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "distributed/process_helpers.hpp"
#include "mxtrain/core/error.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

// The rank processes mpirun started (its children), by their OMPI_COMM_WORLD_RANK.
std::map<int, pid_t> ranks_of(pid_t mpirun) {
  std::map<int, pid_t> result;
  std::ifstream children(strf("/proc/%d/task/%d/children", mpirun, mpirun));
  pid_t child = 0;
  while (children >> child) {
    std::ifstream environ_file(strf("/proc/%d/environ", child), std::ios::binary);
    std::string entry;
    while (std::getline(environ_file, entry, '\0'))
      if (entry.rfind("OMPI_COMM_WORLD_RANK=", 0) == 0) result[std::stoi(entry.substr(21))] = child;
  }
  return result;
}

class MpiStopSafety : public ::testing::Test {
 protected:
  void SetUp() override { corpus_ = test::make_test_corpus(dir_.file("corpus")); }
  std::string job(const std::string& run_dir, int64_t steps, const std::string& extra = "") const {
    return std::string(MXTRAIN_MPIRUN) + " -np 2 " + extra + " " + test::binary_path() + " train " +
           test::tiny_train_flags(corpus_, run_dir) + " --steps " + std::to_string(steps);
  }
  // `train` on two ranks (an MPMD job, `-np 1 A : -np 1 B`) in which rank 1 alone may write only
  // `bytes` a file, SIGXFSZ ignored: a write past that fails with EFBIG, as on a node whose own
  // disk is full. TCP between the ranks (the limit would also fail Open MPI's shared-memory segment
  // of rank 1), and mpirun told not to end the job when a rank exits with an error (srun's
  // default), so the ranks must stop on their own. Returns the job's output, or nothing (a test
  // failure, the ranks killed) when they have not stopped within 120 s.
  std::optional<std::string> job_with_rank_one_file_limit(const std::string& train, int64_t bytes) const {
    const std::string mpmd = std::string(MXTRAIN_MPIRUN) +
                             " --tag-output --mca orte_abort_on_non_zero_status 0 --mca btl self,tcp -np 1 " + train +
                             " : -np 1 sh -c \"trap '' XFSZ; exec prlimit --fsize=" + std::to_string(bytes) + " " +
                             train + "\"";
    test::BackgroundProcess mpirun(mpmd, dir_.file("job.txt"));
    if (mpirun.wait(120)) return mpirun.output();
    for (const auto& [rank, pid] : ranks_of(mpirun.pid())) ::kill(pid, SIGKILL);
    ADD_FAILURE() << "the ranks did not stop after rank 1's write failed:\n" << mpirun.output();
    return std::nullopt;
  }
  test::TempDir dir_;
  std::string corpus_;
};

TEST_F(MpiStopSafety, SigtermToOneRankStopsTheJobWithACheckpoint) {
  const std::string run = dir_.file("run");
  test::BackgroundProcess mpirun(job(run, 1000000), dir_.file("job.txt"));
  test::wait_until([&] { return test::step_losses(run).size() >= 3 || mpirun.wait(0).has_value(); }, 180);
  ASSERT_FALSE(mpirun.wait(0).has_value()) << "the job ended early:\n" << mpirun.output();
  ASSERT_GE(test::step_losses(run).size(), 3u) << mpirun.output();
  std::map<int, pid_t> ranks = ranks_of(mpirun.pid());
  ASSERT_EQ(ranks.size(), 2u) << "cannot find the rank processes of mpirun " << mpirun.pid();
  ::kill(ranks[1], SIGTERM);
  std::optional<int> status = mpirun.wait(100);
  ASSERT_TRUE(status.has_value()) << mpirun.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << mpirun.output();
  EXPECT_NE(mpirun.output().find("another rank received a stop signal"), std::string::npos) << mpirun.output();
  test::expect_stopped_run_resumes_exactly(
      run, dir_.file("reference"), [&](const std::string& dir, int64_t steps) { return job(dir, steps); }, 2,
      mpirun.output());
}

TEST_F(MpiStopSafety, SigkillOfRankZeroDuringACheckpointKeepsThePreviousOne) {
  const std::string run = dir_.file("run");
  test::BackgroundProcess mpirun(job(run, 6, "-x MXT_TEST_CHECKPOINT_PAUSE=4:60") + " --set checkpoint.every=2",
                                 dir_.file("job.txt"));
  test::wait_until([&] { return mpirun.output().find("pausing") != std::string::npos || mpirun.wait(0); }, 180);
  ASSERT_NE(mpirun.output().find("pausing"), std::string::npos) << mpirun.output();
  std::map<int, pid_t> ranks = ranks_of(mpirun.pid());
  ASSERT_EQ(ranks.count(0), 1u);
  ::kill(ranks[0], SIGKILL);
  std::optional<int> status = mpirun.wait(60);
  ASSERT_TRUE(status.has_value()) << "mpirun did not end the job after rank 0 died:\n" << mpirun.output();
  EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  EXPECT_TRUE(std::filesystem::exists(run + "/checkpoints/step_00000004.tmp/rank_00001.bin"));
  EXPECT_FALSE(std::filesystem::exists(run + "/checkpoints/step_00000004"));
  std::vector<std::string> saved = test::complete_checkpoints(run);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(test::checkpoint_step(saved.back()), 2);

  std::string output;
  ASSERT_EQ(test::run_command(job(run, 6) + " --set checkpoint.every=2", &output), 0) << output;
  EXPECT_NE(output.find("resumed from " + run + "/checkpoints/step_00000002 at step 2"), std::string::npos) << output;
  ASSERT_EQ(test::run_command(job(dir_.file("reference"), 6) + " --set checkpoint.every=2", &output), 0) << output;
  test::expect_same_losses(run, dir_.file("reference"), 6);
}

// Rank 1 alone cannot write its checkpoint file (640 KB, past its 64 KB limit): before, rank 0
// waited in the next collective for ever.
TEST_F(MpiStopSafety, AFailedCheckpointWriteOnRankOneStopsEveryRankNamingIt) {
  const std::string run = dir_.file("run");
  std::string output;
  ASSERT_EQ(test::run_command(job(run, 2) + " --set checkpoint.every=2", &output), 0) << output;
  const std::optional<std::string> stopped = job_with_rank_one_file_limit(
      test::binary_path() + " train " + test::tiny_train_flags(corpus_, run) + " --steps 6 --set checkpoint.every=2",
      65536);
  ASSERT_TRUE(stopped.has_value());
  for (int rank : {0, 1})
    EXPECT_NE(stopped->find(strf("[1,%d]<stderr>:mxtrain: system error: checkpoint step 4 was not saved: rank 1 "
                                        "could not write its part of the checkpoint, %s/checkpoints/step_00000004.tmp/"
                                        "rank_00001.bin and .json: File too large; the previous checkpoint %s/"
                                        "checkpoints/step_00000002 is intact",
                                        rank, run.c_str(), run.c_str())),
              std::string::npos)
        << "rank " << rank << " did not name rank 1:\n" << *stopped;
  EXPECT_FALSE(std::filesystem::exists(run + "/checkpoints/step_00000004.tmp"));
  std::vector<std::string> saved = test::complete_checkpoints(run);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(test::checkpoint_step(saved.back()), 2);

  ASSERT_EQ(test::run_command(job(run, 6) + " --set checkpoint.every=2", &output), 0) << output;
  EXPECT_NE(output.find("resumed from " + run + "/checkpoints/step_00000002 at step 2"), std::string::npos) << output;
  ASSERT_EQ(test::run_command(job(dir_.file("reference"), 6) + " --set checkpoint.every=2", &output), 0) << output;
  test::expect_same_losses(run, dir_.file("reference"), 6);
}

// Each rank's FP8 delayed-scaling histories and scales are its own (its data's amaxes): each
// saves and restores its own, and two ranks stopped and restarted match an uninterrupted job.
TEST_F(MpiStopSafety, TwoRanksOfAnFp8DelayedRunResumeBitIdentically) {
  const std::string flags = " -p fp8 --set checkpoint.every=4 --set eval.every=2";
  const std::string run = dir_.file("run"), reference = dir_.file("reference");
  std::string output;
  ASSERT_EQ(test::run_command(job(reference, 8) + flags, &output), 0) << output;
  ASSERT_EQ(test::run_command(job(run, 4) + flags, &output), 0) << output;
  ASSERT_EQ(test::run_command(job(run, 8) + flags, &output), 0) << output;
  EXPECT_NE(output.find("resumed from " + run + "/checkpoints/step_00000004 at step 4"), std::string::npos) << output;
  test::expect_same_losses(run, reference, 8);
}

TEST_F(MpiStopSafety, ACheckpointDirectoryRankOneCannotWriteStopsEveryRankBeforeTheFirstStep) {
  const std::string run = dir_.file("run");
  // Rank 1 may write 16 bytes a file: less than its start-up probe of the checkpoint directory.
  const std::optional<std::string> stopped = job_with_rank_one_file_limit(
      test::binary_path() + " train " + test::tiny_train_flags(corpus_, run) + " --steps 4", 16);
  ASSERT_TRUE(stopped.has_value());
  for (int rank : {0, 1})
    EXPECT_NE(stopped->find(strf("[1,%d]<stderr>:mxtrain: system error: rank 1 cannot write checkpoints to "
                                        "%s/checkpoints: File too large; nothing was trained or written",
                                        rank, run.c_str())),
              std::string::npos)
        << "rank " << rank << " did not name rank 1:\n" << *stopped;
  EXPECT_TRUE(test::step_losses(run).empty()) << *stopped;
}

}  // namespace
}  // namespace mxtrain
