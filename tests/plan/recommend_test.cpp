// The recommendation logic: ranking and explanations on synthetic candidates (independent of
// any model), then the search end to end on small models — every ranked config fits with the
// headroom, the winner is the fastest of everything evaluated, and each objective answers what
// it promises.
#include <gtest/gtest.h>

#include "mxtrain/core/error.hpp"
#include "mxtrain/plan/recommend.hpp"

namespace mxtrain {
namespace {

Candidate synthetic(int64_t micro, const std::string& recompute, double tokens_per_s, uint64_t total_gib,
                    bool fits = true, const std::string& strategy = "full_shard", int gpus = 1) {
  Candidate c;
  c.micro_batch = micro;
  c.micro_batches = 64 / micro;
  c.global_batch = 64;
  c.seq_len = 4096;
  c.recompute = recompute;
  c.precision = "bf16";
  c.strategy = strategy;
  c.gpus = gpus;
  c.tokens_per_s = tokens_per_s;
  c.total_bytes = total_gib << 30;
  c.capacity_bytes = uint64_t{80} << 30;
  c.fits = fits;
  c.fits_with_headroom = fits && total_gib <= 76;
  c.mfu = 0.4;
  c.step_s = 1.0;
  c.time.total_s = 1.0;
  c.time.recompute_s = recompute == "none" ? 0 : 0.2;
  c.time.gemm_s = 0.6;
  return c;
}

bool contains(const std::vector<std::string>& sentences, const std::string& text) {
  for (const std::string& sentence : sentences)
    if (sentence.find(text) != std::string::npos) return true;
  return false;
}

std::string joined(const std::vector<std::string>& sentences) {
  std::string text;
  for (const std::string& sentence : sentences) text += sentence + "\n";
  return text;
}

TEST(Ranking, KeepsOnlyConfigsWithHeadroomFastestFirst) {
  std::vector<Candidate> candidates = {synthetic(4, "none", 1000, 40), synthetic(8, "none", 1500, 78),
                                       synthetic(8, "selective", 1400, 60), synthetic(16, "full", 1300, 50),
                                       synthetic(16, "none", 9000, 90, false)};
  const std::vector<Candidate> ranked = rank_candidates(candidates);
  ASSERT_EQ(ranked.size(), 3u);  // 78 GiB of 80 leaves less than 5%; 90 GiB does not fit
  EXPECT_EQ(ranked[0].recompute, "selective");
  EXPECT_EQ(ranked[1].recompute, "full");
  EXPECT_EQ(ranked[2].micro_batch, 4);
}

TEST(Ranking, NearTiesGoToTheSmallerFootprint) {
  // Within 0.1% of the fastest the throughputs tie and the config with more room left leads; the
  // rest stay in throughput order.
  const std::vector<Candidate> ranked = rank_candidates({synthetic(8, "none", 1000.5, 60), synthetic(4, "selective", 1000.0, 30),
                                                         synthetic(16, "full", 900.0, 20), synthetic(2, "none", 999.9, 45)});
  ASSERT_EQ(ranked.size(), 4u);
  EXPECT_EQ(ranked[0].micro_batch, 4);
  EXPECT_EQ(ranked[1].micro_batch, 8);
  EXPECT_EQ(ranked[2].micro_batch, 2);
  EXPECT_EQ(ranked[3].micro_batch, 16);
  // A clearly faster config is not displaced by a smaller one.
  const std::vector<Candidate> clear = rank_candidates({synthetic(4, "selective", 1000.0, 30), synthetic(8, "none", 1010.0, 60)});
  EXPECT_EQ(clear[0].micro_batch, 8);
  EXPECT_TRUE(better_throughput(clear[0], clear[1]));
}

TEST(Explanation, CheckpointingOnBecauseItLetsALargerMicroBatchFit) {
  const Candidate best = synthetic(8, "selective", 1400, 60);
  const std::vector<Candidate> evaluated = {synthetic(4, "none", 1000, 40), synthetic(8, "none", 0, 82, false), best,
                                            synthetic(8, "full", 1200, 45), synthetic(16, "selective", 0, 81, false)};
  const std::vector<std::string> sentences = explain_choice(best, evaluated, require_gpu("h100"), 0.05);
  EXPECT_TRUE(contains(sentences, "Checkpointing (selective) is on because it lets micro-batch 8 fit, where at most "
                                  "micro-batch 4 fits without it; that is 40% faster"))
      << joined(sentences);
  EXPECT_TRUE(contains(sentences, "full checkpointing, which would also fit but is 17% slower")) << joined(sentences);
  EXPECT_TRUE(contains(sentences, "Micro-batch 8 is the largest that fits with 5% headroom: 16 would need 81.00 GiB"))
      << joined(sentences);
  EXPECT_TRUE(contains(sentences, "8 micro-batches per step")) << joined(sentences);
}

TEST(Explanation, CheckpointingOffWhenEverythingFits) {
  const Candidate best = synthetic(16, "none", 2000, 50);
  const std::vector<Candidate> evaluated = {best, synthetic(16, "selective", 1900, 40),
                                            synthetic(32, "none", 1990, 70)};
  const std::vector<std::string> sentences = explain_choice(best, evaluated, require_gpu("h200"), 0.05);
  EXPECT_TRUE(contains(sentences, "Activation checkpointing is off")) << joined(sentences);
  EXPECT_TRUE(contains(sentences, "Micro-batch 32 also fits but is not faster")) << joined(sentences);
}

TEST(Explanation, NoShardingOnAGpuWithEnoughMemory) {
  Candidate best = synthetic(4, "none", 5000, 60, true, "no_shard", 8);
  best.model_state_bytes = uint64_t{30} << 30;
  const std::vector<Candidate> evaluated = {best, synthetic(4, "none", 4500, 40, true, "full_shard", 8)};
  const std::vector<std::string> sentences = explain_choice(best, evaluated, require_gpu("b200"), 0.05);
  EXPECT_TRUE(contains(sentences, "Sharding is not needed: unsharded model states take 30.00 GiB per GPU"))
      << joined(sentences);
  EXPECT_TRUE(contains(sentences, "11% faster than full_shard")) << joined(sentences);
}

TEST(Explanation, ShardingNeededWhenUnshardedNeverFits) {
  const Candidate best = synthetic(1, "full", 900, 70, true, "full_shard", 8);
  const std::vector<Candidate> evaluated = {synthetic(1, "full", 0, 200, false, "no_shard", 8), best};
  const std::vector<std::string> sentences = explain_choice(best, evaluated, require_gpu("h100"), 0.05);
  EXPECT_TRUE(contains(sentences, "full_shard is needed")) << joined(sentences);
}

RunConfig small_llama(int64_t global) {
  RunConfig config;
  config.model = model_preset("llama-1b");
  config.model.layers = 4;
  config.train.seq_len = 2048;
  config.train.micro_batch_size = 1;
  config.train.global_batch_size = global;
  return config;
}

TEST(Recommend, RankedConfigsFitAndTheWinnerIsTheFastestEvaluated) {
  RecommendOptions options;
  const Recommendation r = recommend(small_llama(64), PlanTarget{"h100", 1, 0}, Calibration::load(), options);
  ASSERT_TRUE(r.found);
  EXPECT_EQ(r.best.global_batch, 64);
  EXPECT_EQ(r.best.micro_batch * r.best.micro_batches, 64);
  for (const Candidate& c : r.ranked) EXPECT_TRUE(c.fits_with_headroom) << c.label();
  for (const Candidate& c : r.evaluated)
    if (c.fits_with_headroom) EXPECT_LE(c.tokens_per_s, r.best.tokens_per_s * 1.001) << c.label() << " beats " << r.best.label();
  // The full plan of the winner agrees with the search's numbers.
  EXPECT_EQ(r.best_plan.micro_batch, r.best.micro_batch);
  EXPECT_TRUE(r.best_plan.fits_with_headroom);
  EXPECT_FALSE(r.explanation.empty());
}

TEST(Recommend, ContextObjectiveFindsALongerSequenceThanTheConfigs) {
  RecommendOptions options;
  options.objective = "context";
  options.max_seq_len = 65536;
  RunConfig config = small_llama(1);
  config.train.seq_len = 1024;
  const Recommendation r = recommend(config, PlanTarget{"h100", 1, 0}, Calibration::load(), options);
  ASSERT_TRUE(r.found);
  EXPECT_GT(r.best.seq_len, 1024);
  EXPECT_TRUE(r.best.fits_with_headroom);
  // A Mistral's sliding window bounds the search: longer sequences would not be its attention.
  config.model.sliding_window = 2048;
  const Recommendation windowed = recommend(config, PlanTarget{"h100", 1, 0}, Calibration::load(), options);
  ASSERT_TRUE(windowed.found);
  EXPECT_LE(windowed.best.seq_len, 2048);
  std::string explanation;
  for (const std::string& line : windowed.explanation) explanation += line + "\n";
  EXPECT_NE(explanation.find("the search stops at 2048: model.sliding_window"), std::string::npos) << explanation;
}

TEST(Recommend, GpusObjectiveNeedsATargetAndReportsUnreachableOnes) {
  RecommendOptions options;
  options.objective = "gpus";
  EXPECT_THROW(recommend(small_llama(8), PlanTarget{"h100", 1, 0}, Calibration::load(), options), Error);
  options.target_tokens_per_s = 1e3;
  options.max_gpus = 1;
  const Recommendation easy = recommend(small_llama(8), PlanTarget{"h100", 1, 0}, Calibration::load(), options);
  ASSERT_TRUE(easy.found);
  EXPECT_EQ(easy.best.gpus, 1);
  options.target_tokens_per_s = 1e12;
  const Recommendation impossible = recommend(small_llama(8), PlanTarget{"h100", 1, 0}, Calibration::load(), options);
  EXPECT_FALSE(impossible.found);
}

TEST(Recommend, UnavailablePrecisionsAreReportedNotSearched) {
  RecommendOptions options;
  options.precisions = {"bf16", "fp7"};
  const Recommendation r = recommend(small_llama(8), PlanTarget{"h100", 1, 0}, Calibration::load(), options);
  ASSERT_EQ(r.unavailable_precisions, std::vector<std::string>{"fp7"});
  options.precisions = {"fp7"};
  EXPECT_THROW(recommend(small_llama(8), PlanTarget{"h100", 1, 0}, Calibration::load(), options), Error);
}

}  // namespace
}  // namespace mxtrain
