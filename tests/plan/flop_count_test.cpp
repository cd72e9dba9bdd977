// The FLOPs the dryrun records for one training step equal an independent count from the model
// shape alone: 2·m·n·k per linear GEMM (plus the bias add or bias-gradient column sums), the
// causal attention's two forward and five backward T×T GEMMs (half the full matrix each), and,
// for recompute, the forward GEMMs and attention of every recomputed block again.
#include <gtest/gtest.h>

#include "mxtrain/model/recompute.hpp"
#include "plan/plan_test_support.hpp"

namespace mxtrain {
namespace {

bool is_gemm(const OpRecord& op) {
  return op.kind == OpKind::linear_forward || op.kind == OpKind::linear_backward_input ||
         op.kind == OpKind::linear_backward_weight;
}
bool is_attention(const OpRecord& op) {
  return op.kind == OpKind::attention_forward || op.kind == OpKind::attention_backward;
}

struct Expected {
  double forward_gemm = 0, backward_gemm = 0, recompute_gemm = 0;
  double forward_attention = 0, backward_attention = 0, recompute_attention = 0;
};

// From the shape alone: no layout, no trace.
Expected analytic(const ModelConfig& m, int64_t batch, int64_t seq, const RecomputePolicy& policy) {
  const double R = static_cast<double>(batch * seq), C = static_cast<double>(m.hidden);
  const double d = static_cast<double>(m.hidden / m.heads);
  const double qkv = static_cast<double>((m.heads + 2 * m.kv_heads) * (m.hidden / m.heads));
  const double up = static_cast<double>(m.family == ModelFamily::llama ? 2 * m.ffn_hidden : m.ffn_hidden);
  const double F = static_cast<double>(m.ffn_hidden), V = static_cast<double>(m.padded_vocab);
  const double L = static_cast<double>(m.layers);
  const double bias = m.bias ? 1.0 : 0.0;
  // One block's forward GEMMs: qkv, out projection, up, down; bias adds one FLOP per output.
  const double qkv_out_up = 2 * R * (C * qkv + C * C + C * up) + bias * R * (qkv + C + up);
  const double block_forward = qkv_out_up + 2 * R * F * C + bias * R * C;
  // Backward: input gradients (no bias) and weight gradients (plus the up projection's bias
  // column sums; the out and down projections' ride on the MLP norm's backward). GPT-2's qkv
  // bias gradient (no RoPE, as many key/value heads as query heads) is an op of its own
  // (qkv_bias_gradient, not a GEMM); any other model's is column sums on its weight GEMM.
  const bool qkv_bias_from_attention = m.family == ModelFamily::gpt2 && m.kv_heads == m.heads;
  const double qkv_bias = qkv_bias_from_attention ? 0.0 : bias * R * qkv;
  const double block_backward = 2 * (2 * R * (C * qkv + C * C + C * up + F * C)) + bias * R * up + qkv_bias;
  const double head = 2 * R * V * C;
  // Causal attention: QKᵀ and PV forward, recomputed QKᵀ plus dV, dP, dQ, dK backward, each half
  // of 2·batch·heads·seq²·head_dim.
  const double attention_gemm = 2 * static_cast<double>(batch * m.heads) * static_cast<double>(seq * seq) * d * 0.5;
  Expected e;
  e.forward_gemm = L * block_forward + head;
  e.backward_gemm = L * block_backward + 2 * head;
  e.forward_attention = L * 2 * attention_gemm;
  e.backward_attention = L * 5 * attention_gemm;
  for (int64_t layer = 0; layer < m.layers; ++layer) {
    if (policy.mode_for_layer(layer) != RecomputeMode::full) continue;
    // A recomputed block reruns everything but the down projection and the residual add.
    e.recompute_gemm += qkv_out_up;
    e.recompute_attention += 2 * attention_gemm;
  }
  return e;
}

class FlopCount : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(FlopCount, TracedFlopsEqualTheAnalyticCount) {
  const auto& [family, recompute] = GetParam();
  const int64_t micro = 2, seq = 48;
  RunConfig config = test::small_run(family, recompute, micro, seq, micro);
  config.train.precision = "bf16";
  const StepTrace trace = test::cpu_equivalent_trace(config, 1);
  const Expected e = analytic(config.model, micro, seq, RecomputePolicy::parse(recompute));
  const StepSlot slot = StepSlot::final_micro_batch;
  auto sum = [&](Phase phase, bool (*kind)(const OpRecord&)) {
    return traced_flops(trace, slot, [&](const OpRecord& op) { return op.phase == phase && kind(op); });
  };
  EXPECT_DOUBLE_EQ(sum(Phase::forward, is_gemm), e.forward_gemm);
  EXPECT_DOUBLE_EQ(sum(Phase::backward, is_gemm), e.backward_gemm);
  EXPECT_DOUBLE_EQ(sum(Phase::recompute, is_gemm), e.recompute_gemm);
  EXPECT_DOUBLE_EQ(sum(Phase::forward, is_attention), e.forward_attention);
  EXPECT_DOUBLE_EQ(sum(Phase::backward, is_attention), e.backward_attention);
  EXPECT_DOUBLE_EQ(sum(Phase::recompute, is_attention), e.recompute_attention);
  // The optimizer touches every parameter once: 16 FLOPs per element of AdamW.
  const double adamw = traced_flops(trace, StepSlot::outside, [](const OpRecord& op) { return op.kind == OpKind::adamw; });
  EXPECT_DOUBLE_EQ(adamw, 16.0 * static_cast<double>(config.model.parameter_count()));
}

INSTANTIATE_TEST_SUITE_P(Policies, FlopCount,
                         ::testing::Combine(::testing::Values("llama", "gpt2"),
                                            ::testing::Values("none", "selective", "full", "1", "2")),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_" + std::get<1>(info.param);
                         });

TEST(FlopCount, AccumulationTracesTwoMicroBatchesAndCountsTheRest) {
  const RunConfig config = test::small_run("llama", "none", 2, 32, 10);  // 5 micro-batches
  const StepTrace trace = test::cpu_equivalent_trace(config, 1);
  EXPECT_EQ(trace.micro_batches, 5);
  EXPECT_EQ(trace.traced_micro_batches, 2);
  auto gemm = [&](StepSlot slot) { return traced_flops(trace, slot, is_gemm); };
  EXPECT_GT(gemm(StepSlot::final_micro_batch), 0);
  EXPECT_DOUBLE_EQ(gemm(StepSlot::non_final_micro_batch), gemm(StepSlot::final_micro_batch));
  EXPECT_DOUBLE_EQ(gemm(StepSlot::outside), 0);
}

}  // namespace
}  // namespace mxtrain
