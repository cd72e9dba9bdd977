// Every Llama preset from 1B to 64B planned on 8 GPUs of every type, with FSDP over a fake
// communicator: the per-GPU model states are the sharded sizes computed from the layout
// (ceil(numel / 8) elements per group) plus at most the allocator's slack per buffer (a large
// block keeps a leftover of up to 1 MiB unsplit), the breakdown adds up to the allocator's peak,
// and the collectives are the FSDP schedule's. How long each plan took is
// recorded (RecordProperty) and printed, never asserted: speed is measured, not unit-tested; the
// acceptance command is in docs/planning.md.
#include <gtest/gtest.h>

#include <cstdio>

#include "mxtrain/backend/allocator.hpp"
#include "mxtrain/model/layout.hpp"
#include "mxtrain/plan/planner.hpp"

namespace mxtrain {
namespace {

class PresetPlans : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

TEST_P(PresetPlans, ShardedStatesAndBreakdownOnEightGpus) {
  const auto& [preset, gpu] = GetParam();
  RunConfig config;
  config.model = model_preset(preset);
  config.train.micro_batch_size = 1;
  config.train.seq_len = 4096;
  config.train.recompute = "full";
  config.dist.strategy = "full_shard";
  const Plan plan = make_plan(config, PlanTarget{gpu, 8, 1}, Calibration::load());
  RecordProperty("plan_seconds", std::to_string(plan.planning_seconds));
  std::printf("[ plan     ] %s on 8 x %s: %.3f s, %s, %.0f tokens/s\n", preset.c_str(), gpu.c_str(),
              plan.planning_seconds, plan.fits ? "fits" : "does not fit", plan.tokens_per_s);

  uint64_t master = 0;
  const std::vector<ParamGroup> groups = build_layout(config.model).groups;
  for (const ParamGroup& group : groups) master += 4 * static_cast<uint64_t>((group.numel + 7) / 8);
  const uint64_t slack = groups.size() * (CachingAllocator::kSmallLimit + CachingAllocator::kRound);
  EXPECT_GE(plan.memory.master_weights, master);
  EXPECT_LE(plan.memory.master_weights, master + slack);
  EXPECT_GE(plan.memory.optimizer_states, 2 * master);
  EXPECT_LE(plan.memory.optimizer_states, 2 * (master + slack));
  EXPECT_EQ(plan.memory.weights + plan.memory.master_weights + plan.memory.gradients + plan.memory.optimizer_states +
                plan.memory.quantized_copies + plan.memory.layer_activations + plan.memory.other_activations +
                plan.memory.logits + plan.memory.scratch + plan.memory.data + plan.memory.library_workspaces +
                plan.memory.communication_buffers,
            plan.memory.peak_live);
  EXPECT_EQ(plan.memory.total, plan.memory.peak_reserved + plan.memory.cuda_context + plan.memory.nccl_buffers);

  // full_shard gathers every group in forward and again in backward — but the head, whose
  // forward and backward run inside one acquire — and reduce-scatters each group's gradient
  // once (one micro-batch).
  int64_t gathers = 0, scatters = 0;
  for (int slot = 0; slot < kStepSlotCount; ++slot)
    for (const CollectiveCount& c : plan.trace.collectives[slot]) {
      if (c.collective.kind == CollectiveKind::all_gather) gathers += c.count;
      if (c.collective.kind == CollectiveKind::reduce_scatter) scatters += c.count;
    }
  const auto group_count = static_cast<int64_t>(groups.size());
  EXPECT_EQ(gathers, 2 * group_count - 1);
  EXPECT_EQ(scatters, group_count);
  EXPECT_GT(plan.time.communication_s, 0);
  EXPECT_GE(plan.time.communication_exposed_s, 0);
  EXPECT_LE(plan.time.communication_exposed_s, plan.time.communication_s + 1e-12);
}

INSTANTIATE_TEST_SUITE_P(Presets, PresetPlans,
                         ::testing::Combine(::testing::Values("llama-1b", "llama-3b", "llama-8b", "llama-14b",
                                                              "llama-32b", "llama-64b"),
                                            ::testing::Values("h100", "h200", "b200", "b300")),
                         [](const auto& info) {
                           std::string name = std::get<0>(info.param) + "_" + std::get<1>(info.param);
                           for (char& c : name)
                             if (c == '-' || c == '.') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace mxtrain
