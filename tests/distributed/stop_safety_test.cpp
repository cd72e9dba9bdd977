// Stop safety of real processes on one rank: SIGTERM to `mxtrain launch` reaches the rank, which
// finishes its step, saves and exits 0, and re-running the same command continues exactly like an
// uninterrupted run; SIGKILL while a checkpoint is half written (rank files done, no manifest,
// not renamed) leaves the previous checkpoint as the one that loads. The same under mpirun with
// several ranks is in tests/mpi/.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>

#include "distributed/process_helpers.hpp"
#include "mxtrain/core/error.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

class StopSafety : public ::testing::Test {
 protected:
  void SetUp() override { corpus_ = test::make_test_corpus(dir_.file("corpus")); }
  std::string train(const std::string& run_dir, int64_t steps) const {
    return test::binary_path() + " train " + test::tiny_train_flags(corpus_, run_dir) + " --steps " +
           std::to_string(steps);
  }
  test::TempDir dir_;
  std::string corpus_;
};

TEST_F(StopSafety, SigtermThroughTheLauncherSavesAndTheSameCommandResumes) {
  const std::string run = dir_.file("run");
  test::BackgroundProcess launcher(test::binary_path() + " launch --nproc-per-node 1 --log-dir " + dir_.file("logs") +
                                       " -- train " + test::tiny_train_flags(corpus_, run) + " --steps 1000000",
                                   dir_.file("launch.txt"));
  test::wait_until([&] { return test::step_losses(run).size() >= 3 || launcher.wait(0).has_value(); }, 120);
  ASSERT_FALSE(launcher.wait(0).has_value()) << "the run ended early:\n" << launcher.output();
  ASSERT_GE(test::step_losses(run).size(), 3u) << launcher.output();
  launcher.signal(SIGTERM);
  std::optional<int> status = launcher.wait(100);  // checkpoint.stop_deadline_s
  ASSERT_TRUE(status.has_value()) << launcher.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << launcher.output();
  EXPECT_NE(launcher.output().find("forwarding it to 1 rank(s)"), std::string::npos) << launcher.output();
  EXPECT_NE(launcher.output().find("signal 15 received: saving a checkpoint"), std::string::npos) << launcher.output();
  test::expect_stopped_run_resumes_exactly(
      run, dir_.file("reference"), [&](const std::string& dir, int64_t steps) { return train(dir, steps); }, 3,
      launcher.output());
}

TEST_F(StopSafety, SigkillDuringACheckpointWriteKeepsThePreviousOne) {
  const std::string run = dir_.file("run");
  test::BackgroundProcess trainer(train(run, 6) + " --set checkpoint.every=2", dir_.file("train.txt"),
                                  {{"MXT_TEST_CHECKPOINT_PAUSE", "4:60"}});
  test::wait_until([&] { return trainer.output().find("pausing") != std::string::npos || trainer.wait(0); }, 120);
  ASSERT_NE(trainer.output().find("pausing"), std::string::npos) << trainer.output();
  trainer.signal(SIGKILL);
  ASSERT_TRUE(trainer.wait(30).has_value());
  EXPECT_TRUE(std::filesystem::exists(run + "/checkpoints/step_00000004.tmp/rank_00000.bin"));
  EXPECT_FALSE(std::filesystem::exists(run + "/checkpoints/step_00000004"));
  std::vector<std::string> saved = test::complete_checkpoints(run);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(test::checkpoint_step(saved.back()), 2);

  std::string output;
  ASSERT_EQ(test::run_command(train(run, 6) + " --set checkpoint.every=2", &output), 0) << output;
  EXPECT_NE(output.find("resumed from " + run + "/checkpoints/step_00000002 at step 2"), std::string::npos) << output;
  EXPECT_FALSE(std::filesystem::exists(run + "/checkpoints/step_00000004.tmp")) << "the leftover was not pruned";
  ASSERT_EQ(test::run_command(train(dir_.file("reference"), 6) + " --set checkpoint.every=2", &output), 0) << output;
  test::expect_same_losses(run, dir_.file("reference"), 6);
}

}  // namespace
}  // namespace mxtrain
