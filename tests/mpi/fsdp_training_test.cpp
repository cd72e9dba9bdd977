// N ranks (this mpirun job) train exactly like one rank with the same global batch: for every
// strategy, with and without gradient accumulation, the loss of every step matches the one-rank
// run to 1e-5 relative and the final weights match. A run saved at N ranks resumes at N/2 ranks
// with another strategy and at one rank, continuing like the uninterrupted run; a stop request
// seen by one rank stops all of them at the same step, and the re-run continues exactly.
#include <gtest/gtest.h>

#include <csignal>
#include <filesystem>
#include <fstream>

#include "mpi/mpi_support.hpp"
#include "mxtrain/train/checkpoint.hpp"
#include "mxtrain/train/stop_signal.hpp"
#include "mxtrain/train/trainer.hpp"
#include "support/test_support.hpp"

namespace fs = std::filesystem;

namespace mxtrain {
namespace {

class FsdpTraining : public ::testing::Test {
 protected:
  // One corpus and one reference run (one rank, micro-batch 8) for the whole suite.
  static void SetUpTestSuite() {
    dir_ = new test::SharedTempDir();
    corpus_ = dir_->file("corpus");
    if (rank() == 0) {
      test::make_test_corpus(corpus_);
      Trainer(test::tiny_run(corpus_, reference(), 8, "full_shard"), {}).run();
    }
    test::mpi_world().barrier();
  }
  static void TearDownTestSuite() {
    delete dir_;
    dir_ = nullptr;
  }
  void SetUp() override { clear_stop_request(); }
  void TearDown() override { clear_stop_request(); }

  static int rank() { return test::mpi_world().rank(); }
  static int ranks() { return test::mpi_world().size(); }
  static std::string reference() { return dir_->file("reference"); }
  static std::string checkpoint(const std::string& run, int64_t step) {
    return run + "/checkpoints/" + step_directory_name(step);
  }

  // Every rank of `world` trains `config`; returns this rank's summary.
  static TrainerSummary train_on(Communicator& world, const RunConfig& config) {
    TrainerContext context;
    context.communicator = &world;
    return Trainer(config, context).run();
  }
  // Rank 0 compares a finished run with the reference: all losses, held-out losses, weights.
  static void expect_like_one_rank(const std::string& run, const RunConfig& config, bool same_validation = true) {
    if (rank() != 0) return;
    test::expect_losses_match(run, reference(), 1, 6);
    if (same_validation) test::expect_losses_match(run, reference(), 1, 6, 1e-5, "val_loss");
    test::expect_weights_match(checkpoint(run, 6), checkpoint(reference(), 6), config);
  }

  static test::SharedTempDir* dir_;
  static std::string corpus_;
};

test::SharedTempDir* FsdpTraining::dir_ = nullptr;
std::string FsdpTraining::corpus_;

TEST_F(FsdpTraining, EveryStrategyTrainsLikeOneRank) {
  for (const std::string strategy : {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"}) {
    SCOPED_TRACE(strategy);
    const std::string run = dir_->file("strategy_" + strategy);
    RunConfig config = test::tiny_run(corpus_, run, 8 / ranks(), strategy);
    config.dist.shard_group_size = ranks() >= 4 ? ranks() / 2 : 1;  // hybrid: 2 groups of N/2 (N = 4)
    TrainerSummary summary = train_on(test::mpi_world(), config);
    EXPECT_EQ(summary.steps_done, 6);
    expect_like_one_rank(run, config);
  }
}

TEST_F(FsdpTraining, GradientAccumulationWithAndWithoutPerMicroBatchReduction) {
  for (const bool sync : {true, false}) {
    SCOPED_TRACE(sync ? "sync every micro-batch" : "reduce on the last micro-batch");
    const std::string run = dir_->file(sync ? "accumulate_sync" : "accumulate_nosync");
    RunConfig config = test::tiny_run(corpus_, run, 4 / ranks() > 0 ? 4 / ranks() : 1,
                                      sync ? "full_shard" : "shard_grad_op");
    config.dist.sync_every_micro_batch = sync;
    ASSERT_GT(8 / (config.train.micro_batch_size * ranks()), 1) << "the test needs accumulation";
    train_on(test::mpi_world(), config);
    expect_like_one_rank(run, config, false);  // held-out batches are micro-batch sized
  }
}

// GPT-2 (biases, learned positions) under FSDP with gradient accumulation, reduced every
// micro-batch and only on the last: its QKV bias gradient's values part is overwritten each
// micro-batch from the output projection's bias gradient summed so far (transformer.cpp), which
// must give the one-rank, one-micro-batch run's weights whichever way the gradients accumulate.
TEST_F(FsdpTraining, Gpt2WithGradientAccumulationTrainsLikeOneRank) {
  auto gpt2_run = [&](const std::string& run, int64_t micro, const std::string& strategy) {
    return test::tiny_training_run(corpus_, run, 6,
                                   {{"model.preset", "tiny-gpt2"}, {"model.kv_heads", "2"},
                                    {"train.micro_batch_size", std::to_string(micro)}, {"train.threads", "1"},
                                    {"dist.strategy", strategy}});
  };
  const std::string reference_run = dir_->file("gpt2_reference");
  if (rank() == 0) Trainer(gpt2_run(reference_run, 8, "full_shard"), {}).run();
  test::mpi_world().barrier();
  for (const bool sync : {true, false}) {
    SCOPED_TRACE(sync ? "sync every micro-batch" : "reduce on the last micro-batch");
    const std::string run = dir_->file(sync ? "gpt2_accumulate_sync" : "gpt2_accumulate_nosync");
    RunConfig config = gpt2_run(run, 4 / ranks() > 0 ? 4 / ranks() : 1, sync ? "full_shard" : "shard_grad_op");
    config.dist.sync_every_micro_batch = sync;
    ASSERT_EQ(config.model.family, ModelFamily::gpt2);
    ASSERT_GT(8 / (config.train.micro_batch_size * ranks()), 1) << "the test needs accumulation";
    train_on(test::mpi_world(), config);
    if (rank() != 0) continue;
    test::expect_losses_match(run, reference_run, 1, 6);
    test::expect_weights_match(checkpoint(run, 6), checkpoint(reference_run, 6), config);
  }
}

TEST_F(FsdpTraining, BfloatGradientReductionIsCloseButNotIdentical) {
  const std::string run = dir_->file("bf16_reduce");
  RunConfig config = test::tiny_run(corpus_, run, 8 / ranks(), "full_shard");
  config.dist.reduce_dtype = "bf16";
  train_on(test::mpi_world(), config);
  if (rank() != 0) return;
  test::expect_losses_match(run, reference(), 1, 1);       // before any update
  test::expect_losses_match(run, reference(), 2, 6, 1e-2);  // BF16-rounded gradients after
  const auto got = test::checkpoint_weights(checkpoint(run, 6), config);
  const auto expected = test::checkpoint_weights(checkpoint(reference(), 6), config);
  EXPECT_NE(got, expected) << "dist.reduce_dtype = bf16 changed nothing";
}

TEST_F(FsdpTraining, SavedAtNRanksResumesAtHalfWithAnotherStrategyAndAtOne) {
  const std::string saved = dir_->file("saved");
  train_on(test::mpi_world(), test::tiny_run(corpus_, saved, 8 / ranks(), "full_shard"));
  // Each continuation starts from a copy of the step-3 checkpoint.
  auto start_from_step3 = [&](const std::string& run) {
    if (rank() == 0) {
      fs::create_directories(run + "/checkpoints");
      fs::copy(checkpoint(saved, 3), checkpoint(run, 3), fs::copy_options::recursive);
    }
    test::mpi_world().barrier();
  };

  if (ranks() >= 4) {
    const std::string half_run = dir_->file("resumed_half");
    start_from_step3(half_run);
    const int half = ranks() / 2;
    std::unique_ptr<Communicator> half_world = test::mpi_world().split(rank() < half ? 0 : 1, rank(), "half");
    if (rank() < half) {
      RunConfig config = test::tiny_run(corpus_, half_run, 8 / half, "shard_grad_op");
      TrainerSummary summary = train_on(*half_world, config);
      EXPECT_EQ(summary.steps_done, 6);
      if (rank() == 0) {
        EXPECT_EQ(test::losses(half_run).begin()->first, 4) << "did not resume at step 4";
        test::expect_losses_match(half_run, saved, 4, 6);
        test::expect_losses_match(half_run, reference(), 4, 6);
        test::expect_weights_match(checkpoint(half_run, 6), checkpoint(reference(), 6), config);
      }
    }
    test::mpi_world().barrier();
  }

  const std::string one_run = dir_->file("resumed_one");
  start_from_step3(one_run);
  if (rank() == 0) {
    RunConfig config = test::tiny_run(corpus_, one_run, 8, "full_shard");
    TrainerSummary summary = Trainer(config, {}).run();  // the local store, world size 1
    EXPECT_EQ(summary.steps_done, 6);
    EXPECT_EQ(test::losses(one_run).begin()->first, 4);
    test::expect_losses_match(one_run, saved, 4, 6);
    test::expect_weights_match(checkpoint(one_run, 6), checkpoint(saved, 6), config);
  }
  test::mpi_world().barrier();
}

TEST_F(FsdpTraining, AStopSeenByOneRankStopsEveryRankAtTheSameStep) {
  const std::string run = dir_->file("stopped");
  RunConfig config = test::tiny_run(corpus_, run, 8 / ranks(), "hybrid_shard");
  config.dist.shard_group_size = ranks() >= 4 ? ranks() / 2 : 1;
  if (rank() == ranks() - 1) request_stop_for_test(SIGTERM);  // only the last rank got the signal
  TrainerSummary first = train_on(test::mpi_world(), config);
  EXPECT_TRUE(first.stopped_by_signal);
  EXPECT_EQ(first.steps_done, 1);
  clear_stop_request();
  TrainerSummary second = train_on(test::mpi_world(), config);  // the same command again
  EXPECT_FALSE(second.stopped_by_signal);
  EXPECT_EQ(second.steps_done, 6);
  if (rank() == 0) {
    // Step 1 was trained once: the second run resumed from the stop checkpoint.
    std::ifstream metrics(run + "/metrics.jsonl");
    int step_one_lines = 0;
    for (std::string line; std::getline(metrics, line);)
      step_one_lines += line.find("\"step\":1,") != std::string::npos && line.find("\"loss\"") != std::string::npos;
    EXPECT_EQ(step_one_lines, 1);
    test::expect_losses_match(run, reference(), 1, 6);
    test::expect_weights_match(checkpoint(run, 6), checkpoint(reference(), 6), config);
  }
}

}  // namespace
}  // namespace mxtrain
