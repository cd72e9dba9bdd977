// The command line's answers to out-of-range and misplaced input (issue 24): each names the
// offending verb, value or path with a fix, exits 2 (3: out of memory), and never ends in a
// signal, an OOM kill, std::bad_alloc or "internal error".
#include <gtest/gtest.h>

#include <filesystem>

#include "support/test_support.hpp"

namespace mxtrain {
namespace {

struct Outcome {
  int status = 0;
  std::string output;
};

// A bounded address space: a regression that allocates without bound fails here with bad_alloc
// instead of taking the machine's memory. Not under AddressSanitizer (the asan preset), which
// maps terabytes of shadow memory at start.
#if defined(__SANITIZE_ADDRESS__)
constexpr const char* kAddressSpaceLimit = "";
#else
constexpr const char* kAddressSpaceLimit = "ulimit -v 8000000; ";
#endif

Outcome run(const std::string& arguments) {
  Outcome outcome;
  outcome.status =
      test::run_command(std::string(kAddressSpaceLimit) + test::binary_path() + " " + arguments, &outcome.output);
  return outcome;
}

void expect_clean_failure(const Outcome& outcome, int status, const std::string& needle) {
  EXPECT_EQ(outcome.status, status) << outcome.output;
  EXPECT_NE(outcome.output.find(needle), std::string::npos) << "no '" << needle << "' in:\n" << outcome.output;
  EXPECT_EQ(outcome.output.find("internal error"), std::string::npos) << outcome.output;
  EXPECT_EQ(outcome.output.find("unexpected error"), std::string::npos) << outcome.output;
  EXPECT_NE(outcome.output.find("fix:"), std::string::npos) << outcome.output;
}

TEST(CommandLineBounds, HugeSizesInPlanAndTrainAreRefusedByRange) {
  expect_clean_failure(run("plan --set model.layers=100000000"), 2, "model.layers expects an integer from 1 to 1,024");
  expect_clean_failure(run("plan --set train.global_batch_size=4000000000000000"), 2, "train.global_batch_size");
  expect_clean_failure(run("plan --set model.ffn_hidden=4000000000000000"), 2, "model.ffn_hidden");
  expect_clean_failure(run("plan --set model.vocab_size=9223372036854775807 --set model.padded_vocab=9223372036854775807"),
                       2, "model.vocab_size");
  expect_clean_failure(run("train --set model.layers=1000000 --steps 1 --print-config"), 2, "model.layers");
}

TEST(CommandLineBounds, LargestInRangeShapeIsPlannedOrRefusedCleanly) {
  // In range, far beyond any GPU: the planner reports it does not fit, or a tensor too large.
  const Outcome outcome = run("plan --set model.layers=1024 --set model.hidden=131072 --set model.heads=1024 "
                              "--set model.kv_heads=1024 --set model.ffn_hidden=1048576 --set model.vocab_size=16777216 "
                              "--set model.padded_vocab=16777216 -b 65536 -s 4194304");
  EXPECT_TRUE(outcome.status == 0 || outcome.status == 2 || outcome.status == 3) << outcome.output;
  EXPECT_EQ(outcome.output.find("internal error"), std::string::npos) << outcome.output;
  EXPECT_EQ(outcome.output.find("unexpected error"), std::string::npos) << outcome.output;
}

TEST(CommandLineBounds, CpuTrainingThatCannotFitStopsBeforeAllocating) {
  // llama-64b on the CPU in FP32 needs about a terabyte: the planner's figure, before any buffer.
  test::TempDir dir;
  const Outcome outcome = run("train -m llama-64b -d cpu -p fp32 -b 1 -s 64 --steps 1 -o " + dir.path());
  expect_clean_failure(outcome, 3, "of host memory");
  EXPECT_NE(outcome.output.find("available (MemAvailable"), std::string::npos) << outcome.output;
  EXPECT_FALSE(std::filesystem::exists(dir.path() + "/checkpoints")) << outcome.output;
  expect_clean_failure(run("bench -m llama-64b -d cpu -p fp32 -b 1 -s 64 --warmup 0 --timed 1"), 3, "of host memory");
}

TEST(CommandLineBounds, DirectoryAsConfigFileIsRefused) {
  test::TempDir dir;
  expect_clean_failure(run("train " + dir.path() + " --print-config"), 2, "is a directory, not a TOML file");
  expect_clean_failure(run("plan " + dir.path()), 2, "is a directory");
  expect_clean_failure(run("train /dev/zero --print-config"), 2, "is not a regular file");
  expect_clean_failure(run("train " + dir.file("missing.toml") + " --print-config"), 2, "no such file");
}

TEST(CommandLineBounds, UnknownVerbIsNamed) {
  const Outcome outcome = run("frobnicate --steps 3");
  expect_clean_failure(outcome, 2, "unknown command 'frobnicate'");
  EXPECT_NE(outcome.output.find("train, prepare"), std::string::npos) << outcome.output;
}

TEST(CommandLineBounds, ZeroRankCountsNameTheValueAndRange) {
  for (const std::string& arguments : {std::string("train --world-size 0 --print-config"),
                                       std::string("launch --nproc-per-node 0 -- train"),
                                       std::string("plan --gpus 0")}) {
    const Outcome outcome = run(arguments);
    EXPECT_NE(outcome.status, 0) << arguments;
    EXPECT_NE(outcome.output.find("'0' is not an integer from 1 to 65,536"), std::string::npos) << outcome.output;
    EXPECT_EQ(outcome.output.find("1.79"), std::string::npos) << outcome.output;
    EXPECT_EQ(outcome.output.find("179769"), std::string::npos) << outcome.output;
  }
}

}  // namespace
}  // namespace mxtrain
