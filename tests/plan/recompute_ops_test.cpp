// Activation checkpointing changes exactly the ops it should, counted on the dryrun (docs/conventions.md
// #14): every op outside the recompute phase is the same as without checkpointing, and the
// recompute phase holds, per checkpointed block,
//   selective: the two norms and the MLP activation;
//   full:      the block's forward but the activation, the down projection and the residual
//              add (norm, QKV, RoPE, attention, out projection, add+norm, up), then the norms
//              and the activation as selective does — the rerun keeps only what selective
//              keeps, so the first norm is recomputed once more right before its use;
//   K:         full for the first K blocks.
// GPT-2 only: a block that keeps its MLP activation takes GELU from the up projection's
// epilogue (linear_forward_gelu, recorded as linear_forward), a checkpointed block runs it as
// gelu_forward in its forward too (Transformer::layer_forward says why).
// And the peak falls as more is recomputed.
#include <gtest/gtest.h>

#include <map>

#include "mxtrain/model/recompute.hpp"
#include "plan/plan_test_support.hpp"

namespace mxtrain {
namespace {

using Counts = std::map<std::pair<OpKind, Phase>, int64_t>;

Counts count_ops(const StepTrace& trace) {
  Counts counts;
  for (int slot = 0; slot < kStepSlotCount; ++slot)
    for (const OpCount& entry : trace.ops[slot]) counts[{entry.op.kind, entry.op.phase}] += entry.count;
  return counts;
}

Counts expected_recompute(const std::string& family, const RecomputePolicy& policy, int64_t layers) {
  const bool llama = family == "llama";
  const OpKind activation = llama ? OpKind::swiglu_forward : OpKind::gelu_forward;
  Counts counts;
  for (int64_t layer = 0; layer < layers; ++layer) {
    switch (policy.mode_for_layer(layer)) {
      case RecomputeMode::none: break;
      case RecomputeMode::selective:
        counts[{OpKind::norm_forward, Phase::recompute}] += 2;
        counts[{activation, Phase::recompute}] += 1;
        break;
      case RecomputeMode::full:
        // the rerun's attention and MLP norms (its residual add rides on the out projection's
        // GEMM), then both norms again right before their GEMMs
        counts[{OpKind::norm_forward, Phase::recompute}] += 2 + 2;
        counts[{OpKind::linear_forward, Phase::recompute}] += 3;
        if (llama) counts[{OpKind::rope_forward, Phase::recompute}] += 1;
        counts[{OpKind::attention_forward, Phase::recompute}] += 1;
        counts[{activation, Phase::recompute}] += 1;
        break;
    }
  }
  return counts;
}

class RecomputeOps : public ::testing::TestWithParam<std::string> {};

TEST_P(RecomputeOps, ExactlyTheCheckpointedOpsAreAdded) {
  const std::string family = GetParam();
  const Counts none = count_ops(test::cpu_equivalent_trace(test::small_run(family, "none", 2, 32, 2), 1));
  for (const std::string policy_text : {"selective", "full", "1", "2", "3"}) {
    SCOPED_TRACE(policy_text);
    const RunConfig config = test::small_run(family, policy_text, 2, 32, 2);
    const Counts counts = count_ops(test::cpu_equivalent_trace(config, 1));
    Counts recompute, rest, none_rest;
    for (const auto& [key, count] : counts) (key.second == Phase::recompute ? recompute : rest)[key] = count;
    for (const auto& [key, count] : none) none_rest[key] = count;
    const RecomputePolicy policy = RecomputePolicy::parse(policy_text);
    if (family != "llama")
      for (int64_t layer = 0; layer < config.model.layers; ++layer)
        if (policy.mode_for_layer(layer) != RecomputeMode::none) ++none_rest[{OpKind::gelu_forward, Phase::forward}];
    EXPECT_EQ(rest, none_rest) << "ops outside the recompute phase must not change";
    EXPECT_EQ(recompute, expected_recompute(family, policy, config.model.layers));
  }
}

TEST_P(RecomputeOps, PeakFallsAsMoreIsRecomputed) {
  const std::string family = GetParam();
  auto peak = [&](const std::string& policy) {
    RunConfig config = test::small_run(family, policy, 4, 64, 4);
    config.model.layers = 6;
    return test::cpu_equivalent_trace(config, 1).memory.peak_live_bytes;
  };
  EXPECT_GT(peak("none"), peak("selective"));
  EXPECT_GT(peak("selective"), peak("full"));
  EXPECT_GT(peak("none"), peak("2"));
  EXPECT_GT(peak("2"), peak("4"));
  EXPECT_EQ(peak("6"), peak("full"));
  EXPECT_EQ(peak("0"), peak("none"));
}

INSTANTIATE_TEST_SUITE_P(Families, RecomputeOps, ::testing::Values("llama", "gpt2"));

}  // namespace
}  // namespace mxtrain
