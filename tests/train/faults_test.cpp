// Faults of whole `mxtrain train` processes, each ending with nothing lost: a second run on a
// directory in use is refused (naming the first) and a killed run's lock is taken over; a full
// disk during metrics or during a checkpoint stops the run at once with the file named, no record
// cut short and the previous checkpoint intact; SIGKILL at each point of a save leaves a
// checkpoint that loads and a continuation equal to an uninterrupted run; a resumed run does not
// repeat metric records; a non-finite gradient stops the run before anything non-finite is saved
// (train.nonfinite = stop) or drops that step's update (skip), up to train.nonfinite_max_skips in
// a row.
//
// A full disk is simulated with RLIMIT_FSIZE (prlimit --fsize) and SIGXFSZ ignored: a write past
// the limit then fails with EFBIG exactly where a full disk fails with ENOSPC (no root, no tmpfs
// needed). Non-finite gradients come from the test-only MXT_TEST_NAN_GRADIENT_STEPS hook.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "distributed/process_helpers.hpp"
#include "mxtrain/core/error.hpp"
#include "support/test_support.hpp"

namespace fs = std::filesystem;

namespace mxtrain {
namespace {

class Faults : public ::testing::Test {
 protected:
  void SetUp() override { corpus_ = test::make_test_corpus(dir_.file("corpus")); }
  std::string train(const std::string& run_dir, int64_t steps, const std::string& extra = "") const {
    return test::binary_path() + " train " + test::tiny_train_flags(corpus_, run_dir) + " --steps " +
           std::to_string(steps) + " --set log.tensorboard=false " + extra;
  }
  // The same command with writes past `bytes` per file failing (EFBIG, as a full disk's ENOSPC).
  static std::string with_file_limit(const std::string& command, int64_t bytes) {
    return "trap '' XFSZ; prlimit --fsize=" + std::to_string(bytes) + " " + command;
  }
  // Records of metrics.jsonl: every line parses (nothing cut short); counts step records.
  static std::map<int64_t, int> step_record_counts(const std::string& run_dir) {
    std::map<int64_t, int> counts;
    std::ifstream in(run_dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      const nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
      EXPECT_FALSE(record.is_discarded()) << "a metrics record cut short: " << line;
      if (!record.is_discarded() && record.contains("loss")) ++counts[record["step"].get<int64_t>()];
    }
    return counts;
  }
  test::TempDir dir_;
  std::string corpus_;
};

TEST_F(Faults, ASecondRunOnADirectoryInUseIsRefusedAndAKilledRunsLockIsTakenOver) {
  const std::string run = dir_.file("run");
  test::BackgroundProcess first(train(run, 1000000), dir_.file("first.txt"));
  test::wait_until([&] { return test::step_losses(run).size() >= 2 || first.wait(0).has_value(); }, 120);
  ASSERT_FALSE(first.wait(0).has_value()) << first.output();
  std::string output;
  EXPECT_NE(test::run_command(train(run, 5), &output), 0) << output;
  EXPECT_NE(output.find("is in use by another mxtrain run (pid " + std::to_string(first.pid())), std::string::npos)
      << output;
  EXPECT_NE(output.find("-o DIR"), std::string::npos) << output;
  EXPECT_FALSE(first.wait(0).has_value()) << "the first run was disturbed:\n" << first.output();

  first.signal(SIGKILL);  // leaves its lock file behind, naming a dead process
  ASSERT_TRUE(first.wait(30).has_value());
  const size_t trained = test::step_losses(run).size();
  ASSERT_EQ(test::run_command(train(run, static_cast<int64_t>(trained) + 2), &output), 0) << output;
  EXPECT_NE(output.find("stale lock"), std::string::npos) << output;
}

TEST_F(Faults, AFullDiskDuringMetricsStopsTheRunAtOnceWithNoRecordCutShort) {
  const std::string run = dir_.file("run");
  std::string output;
  ASSERT_EQ(test::run_command(train(run, 2), &output), 0) << output;  // a checkpoint at step 2
  // Room for config.toml (rewritten at start) and about a dozen more records.
  const int64_t limit = static_cast<int64_t>(std::max(fs::file_size(run + "/metrics.jsonl"),
                                                      fs::file_size(run + "/config.toml"))) + 4000;
  const int status = test::run_command(with_file_limit(train(run, 400), limit), &output);
  EXPECT_NE(status, 0) << output;
  EXPECT_NE(output.find("cannot write the metrics file " + run + "/metrics.jsonl"), std::string::npos) << output;
  const std::map<int64_t, int> counts = step_record_counts(run);
  ASSERT_FALSE(counts.empty());
  EXPECT_LT(counts.rbegin()->first, 100) << "training went on after the metrics file could not be written";
  // The previous checkpoint is intact and the run resumes from it (the checkpoint the failing
  // run tried on the way out did not fit either).
  ASSERT_EQ(test::run_command(train(run, 6), &output), 0) << output;
  EXPECT_NE(output.find("resumed from " + run + "/checkpoints/step_00000002 at step 2"), std::string::npos) << output;
  for (const auto& [step, count] : step_record_counts(run)) EXPECT_EQ(count, 1) << "step " << step;
}

TEST_F(Faults, AFullDiskDuringACheckpointKeepsThePreviousOne) {
  const std::string run = dir_.file("run");
  std::string output;
  ASSERT_EQ(test::run_command(train(run, 2), &output), 0) << output;
  const int64_t limit = 64 * 1024;  // metrics and config fit; a rank file (about 1.3 MB) does not
  ASSERT_GT(fs::file_size(run + "/checkpoints/step_00000002/rank_00000.bin"), static_cast<uintmax_t>(limit));
  EXPECT_NE(test::run_command(with_file_limit(train(run, 6, "--set checkpoint.every=4"), limit), &output), 0)
      << output;
  EXPECT_NE(output.find("rank_00000.bin"), std::string::npos) << output;
  EXPECT_NE(output.find("free"), std::string::npos) << output;
  std::vector<std::string> saved = test::complete_checkpoints(run);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(test::checkpoint_step(saved[0]), 2);
  ASSERT_EQ(test::run_command(train(run, 6, "--set checkpoint.every=4"), &output), 0) << output;
  EXPECT_NE(output.find("resumed from " + saved[0] + " at step 2"), std::string::npos) << output;
  ASSERT_EQ(test::run_command(train(dir_.file("reference"), 6, "--set checkpoint.every=4"), &output), 0) << output;
  test::expect_same_losses(run, dir_.file("reference"), 6);
  for (const auto& [step, count] : step_record_counts(run)) EXPECT_EQ(count, 1) << "step " << step;
}

// A run stopped at a checkpoint and started again continues bit-identically in every precision
// the CPU runs: FP8 delayed scaling's amax histories and scales and NVFP4's stochastic-rounding
// streams are saved with the weights (before, both started afresh: the losses differed from step 5
// and step 6 on); and a held-out evaluation changes no training step (its FP8 amax records once
// raised the next step's delayed scales, so a run's losses depended on eval.every).
TEST_F(Faults, EveryPrecisionResumesBitIdenticallyAndEvaluationChangesNoStep) {
  for (const std::string precision : {"fp32", "fp8", "fp8-current", "mxfp8", "nvfp4"}) {
    SCOPED_TRACE(precision);
    const std::string flags = "-p " + precision + " --set checkpoint.every=4";
    const std::string reference = dir_.file(precision + "_reference"), stopped = dir_.file(precision + "_stopped");
    const std::string evaluated = dir_.file(precision + "_evaluated");
    std::string output;
    ASSERT_EQ(test::run_command(train(reference, 8, flags), &output), 0) << output;
    ASSERT_EQ(test::run_command(train(stopped, 4, flags), &output), 0) << output;
    ASSERT_EQ(test::run_command(train(stopped, 8, flags), &output), 0) << output;
    EXPECT_NE(output.find("resumed from"), std::string::npos) << output;
    EXPECT_EQ(output.find("start afresh"), std::string::npos) << output;
    test::expect_same_losses(stopped, reference, 8);
    ASSERT_EQ(test::run_command(train(evaluated, 8, flags + " --set eval.every=1"), &output), 0) << output;
    test::expect_same_losses(evaluated, reference, 8);
  }
}

// A checkpoint directory that cannot be written (here a file stands where it goes) stops the run
// before its first step, not at its first save: nothing is trained and nothing written there.
TEST_F(Faults, ACheckpointDirectoryThatCannotBeWrittenStopsTheRunBeforeItsFirstStep) {
  const std::string run = dir_.file("run");
  fs::create_directories(run);
  std::ofstream(run + "/checkpoints") << "a file where the checkpoint directory goes\n";
  std::string output;
  EXPECT_NE(test::run_command(train(run, 4), &output), 0) << output;
  EXPECT_NE(output.find("rank 0 cannot write checkpoints to " + run + "/checkpoints"), std::string::npos) << output;
  EXPECT_NE(output.find("nothing was trained or written"), std::string::npos) << output;
  EXPECT_NE(output.find("a file is where a directory of " + run + "/checkpoints should be"), std::string::npos)
      << output;
  EXPECT_TRUE(test::step_losses(run).empty()) << output;
  fs::remove(run + "/checkpoints");
  ASSERT_EQ(test::run_command(train(run, 2), &output), 0) << output;
  for (const auto& entry : fs::directory_iterator(run + "/checkpoints"))
    EXPECT_EQ(entry.path().filename().string().rfind(".mxtrain-write-test", 0), std::string::npos)
        << "the start-up probe was left behind: " << entry.path();
}

// SIGKILL after the rank files, before the manifest, before the rename, and after the rename
// (before pruning): each time the newest checkpoint that loads is used, and the continuation equals
// an uninterrupted run with every metric record once.
TEST_F(Faults, SigkillAtEachPointOfASaveLosesNothing) {
  std::string output;
  ASSERT_EQ(test::run_command(train(dir_.file("reference"), 8, "--set checkpoint.every=2"), &output), 0) << output;
  for (const std::string point : {"rank_files", "manifest", "rename", "prune"}) {
    SCOPED_TRACE(point);
    const std::string run = dir_.file(std::string("run_") + point);
    test::BackgroundProcess trainer(train(run, 8, "--set checkpoint.every=2 --set checkpoint.keep=1"),
                                    dir_.file(std::string("train_") + point + ".txt"),
                                    {{"MXT_TEST_CHECKPOINT_PAUSE", std::string("6:60:") + point}});
    test::wait_until([&] { return trainer.output().find("pausing") != std::string::npos || trainer.wait(0); }, 120);
    ASSERT_NE(trainer.output().find("pausing"), std::string::npos) << trainer.output();
    trainer.signal(SIGKILL);
    ASSERT_TRUE(trainer.wait(30).has_value());
    const int64_t expected = std::string(point) == "prune" ? 6 : 4;
    ASSERT_EQ(test::run_command(train(run, 8, "--set checkpoint.every=2 --set checkpoint.keep=1"), &output), 0)
        << output;
    EXPECT_NE(output.find("resumed from " + run + "/checkpoints/" + strf("step_%08d", static_cast<int>(expected))),
              std::string::npos)
        << output;
    test::expect_same_losses(run, dir_.file("reference"), 8);
    for (const auto& [step, count] : step_record_counts(run)) EXPECT_EQ(count, 1) << "step " << step;
  }
}

TEST_F(Faults, ANonFiniteGradientStopsTheRunBeforeAnythingIsSaved) {
  const std::string run = dir_.file("run");
  std::string output;
  const int status = test::run_command(
      "MXT_TEST_NAN_GRADIENT_STEPS=4 " + train(run, 8, "--set checkpoint.every=2"), &output);
  EXPECT_NE(status, 0) << output;
  EXPECT_NE(output.find("not finite at step 4"), std::string::npos) << output;
  EXPECT_NE(output.find("train.nonfinite"), std::string::npos) << output;
  std::vector<std::string> saved = test::complete_checkpoints(run);
  ASSERT_EQ(saved.size(), 1u);
  EXPECT_EQ(test::checkpoint_step(saved[0]), 2);
  // The advised resume works: the run continues from step 2 like an uninterrupted one.
  ASSERT_EQ(test::run_command(train(run, 8, "--set checkpoint.every=2"), &output), 0) << output;
  ASSERT_EQ(test::run_command(train(dir_.file("reference"), 8, "--set checkpoint.every=2"), &output), 0) << output;
  test::expect_same_losses(run, dir_.file("reference"), 8);
}

TEST_F(Faults, ARunThatStopsBeforeItsFirstSaveLeavesNoCheckpointDirectory) {
  // The start-up write check makes the checkpoint directory to probe it; a run that stops before
  // it saves anything (here a non-finite gradient at step 1; on the GPU, an out-of-memory) must
  // not leave it behind, empty, for the next run or the user to take for a checkpoint.
  const std::string run = dir_.file("run");
  std::string output;
  EXPECT_NE(test::run_command("MXT_TEST_NAN_GRADIENT_STEPS=1 " + train(run, 4, "--set checkpoint.every=2"), &output),
            0);
  EXPECT_NE(output.find("not finite at step 1"), std::string::npos) << output;
  EXPECT_FALSE(fs::exists(run + "/checkpoints")) << output;
  // The same run without the fault saves where the check looked.
  ASSERT_EQ(test::run_command(train(run, 4, "--set checkpoint.every=2"), &output), 0) << output;
  EXPECT_EQ(test::complete_checkpoints(run).size(), 2u) << output;
}

TEST_F(Faults, SkipDropsANonFiniteStepsUpdateAndCountsIt) {
  const std::string run = dir_.file("run");
  std::string output;
  ASSERT_EQ(test::run_command("MXT_TEST_NAN_GRADIENT_STEPS=4 " +
                                  train(run, 8, "--set checkpoint.every=2 --set train.nonfinite=skip"),
                              &output),
            0)
      << output;
  EXPECT_NE(output.find("skipped (non-finite)"), std::string::npos) << output;
  std::ifstream in(run + "/metrics.jsonl");
  int skipped_records = 0;
  int64_t last_count = -1;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (!record.contains("loss")) continue;
    EXPECT_TRUE(std::isfinite(record["loss"].get<double>())) << line;
    if (record.value("skipped", false)) {
      ++skipped_records;
      EXPECT_EQ(record["step"], 4) << line;
    }
    last_count = record.value("nonfinite_skips", int64_t{-1});
  }
  EXPECT_EQ(skipped_records, 1);
  EXPECT_EQ(last_count, 1);
}

TEST_F(Faults, SkipStopsAfterTooManyNonFiniteStepsInARow) {
  const std::string run = dir_.file("run");
  std::string output;
  const int status = test::run_command(
      "MXT_TEST_NAN_GRADIENT_STEPS=3-100 " +
          train(run, 12, "--set checkpoint.every=2 --set train.nonfinite=skip --set train.nonfinite_max_skips=3"),
      &output);
  EXPECT_NE(status, 0) << output;
  EXPECT_NE(output.find("train.nonfinite_max_skips = 3"), std::string::npos) << output;
  EXPECT_NE(output.find("at step 6"), std::string::npos) << output;
  // Skipped steps leave the weights finite, so the checkpoints of steps 2 and 4 were saved.
  std::vector<std::string> saved = test::complete_checkpoints(run);
  ASSERT_FALSE(saved.empty());
  EXPECT_EQ(test::checkpoint_step(saved.back()), 4);
}

}  // namespace
}  // namespace mxtrain
