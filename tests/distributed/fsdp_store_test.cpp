// The FSDP store in one process. With a world of one (the single-process communicator) every
// strategy trains bit for bit like the local store — losses, gradient norms and weights — with
// and without gradient accumulation and with a tied embedding. On the dryrun backend over a fake
// world of 8 ranks, the schedule is checked by counting: how many all-gathers, reduce-scatters
// and all-reduces each strategy issues per step and on which group, with how many bytes, how many
// gathered blocks are alive at once, and that the ranks' slices tile every group.
#include <gtest/gtest.h>

#include <cstring>
#include <map>

#include "mxtrain/backend/dryrun/dryrun_backend.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/distributed/fake_communicator.hpp"
#include "mxtrain/distributed/fsdp_store.hpp"
#include "mxtrain/distributed/single_communicator.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/train/session.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

RunConfig small_run(const std::string& preset, int64_t micro_batch) {
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = {{"model.preset", preset},       {"model.hidden", "32"},   {"model.heads", "2"},
                       {"model.kv_heads", "2"},        {"model.layers", "2"},    {"model.ffn_hidden", "64"},
                       {"model.max_seq_len", "16"},    {"train.seq_len", "16"},  {"train.device", "cpu"},
                       {"train.micro_batch_size", std::to_string(micro_batch)}, {"train.threads", "1"}};
  return load_config(sources);
}

PrecisionPlan fp32() {
  PrecisionPlan plan;
  plan.name = "fp32";
  return plan;
}

struct History {
  std::vector<double> losses, grad_norms;
  std::vector<std::vector<float>> weights;  // per group, the master weights after the last step
};

// Three steps of `accumulation` micro-batches of deterministic tokens.
History train(Backend& backend, const RunConfig& config, std::unique_ptr<ParameterStore> store, int accumulation) {
  TrainingSession session(config, backend, fp32(), std::move(store));
  const int64_t rows = config.train.micro_batch_size * config.train.seq_len;
  std::vector<std::vector<int32_t>> tokens(static_cast<size_t>(accumulation)), targets = tokens;
  History history;
  for (int step = 1; step <= 3; ++step) {
    std::vector<TokenBatch> batches;
    for (int i = 0; i < accumulation; ++i) {
      tokens[i].resize(static_cast<size_t>(rows));
      targets[i].resize(static_cast<size_t>(rows));
      for (int64_t j = 0; j < rows; ++j) {
        tokens[i][j] = static_cast<int32_t>((j * 37 + i * 101) % config.model.vocab_size);
        targets[i][j] = static_cast<int32_t>((j * 53 + i * 7) % config.model.vocab_size);
      }
      batches.push_back(TokenBatch{tokens[i].data(), targets[i].data(), config.train.micro_batch_size,
                                   config.train.seq_len});
    }
    StepResult result = session.step(batches, rows * accumulation, 1e-2, step);
    history.losses.push_back(result.loss);
    history.grad_norms.push_back(result.grad_norm);
  }
  for (const ParamShard& shard : session.params().shards()) history.weights.push_back(test::download(backend, shard.master));
  return history;
}

struct WorldOfOneCase {
  std::string preset, strategy;
  int accumulation;
  bool sync_every;
};

class WorldOfOne : public ::testing::TestWithParam<WorldOfOneCase> {};

TEST_P(WorldOfOne, TrainsBitForBitLikeTheLocalStore) {
  const WorldOfOneCase& c = GetParam();
  RunConfig config = small_run(c.preset, 2);
  config.dist.strategy = c.strategy;
  config.dist.sync_every_micro_batch = c.sync_every;
  std::unique_ptr<Backend> backend = create_backend("cpu", backend_options(config));
  History local = train(*backend, config, make_parameter_store(*backend, config, fp32(), nullptr, 1), c.accumulation);

  SingleProcessCommunicator world(*backend);
  auto store = make_parameter_store(*backend, config, fp32(), &world, 1);
  ASSERT_NE(dynamic_cast<FsdpParameterStore*>(store.get()), nullptr);
  History sharded = train(*backend, config, std::move(store), c.accumulation);

  EXPECT_EQ(local.losses, sharded.losses);
  EXPECT_EQ(local.grad_norms, sharded.grad_norms);
  ASSERT_EQ(local.weights.size(), sharded.weights.size());
  for (size_t g = 0; g < local.weights.size(); ++g) {
    ASSERT_EQ(local.weights[g].size(), sharded.weights[g].size());
    EXPECT_EQ(0, std::memcmp(local.weights[g].data(), sharded.weights[g].data(), local.weights[g].size() * 4))
        << "group " << g;
  }
  EXPECT_GT(local.losses.front(), local.losses.back()) << "the model should learn the repeated tokens";
}

INSTANTIATE_TEST_SUITE_P(
    Strategies, WorldOfOne,
    ::testing::Values(WorldOfOneCase{"tiny", "full_shard", 1, true}, WorldOfOneCase{"tiny", "full_shard", 2, true},
                      WorldOfOneCase{"tiny", "shard_grad_op", 2, true}, WorldOfOneCase{"tiny", "no_shard", 2, true},
                      WorldOfOneCase{"tiny", "hybrid_shard", 2, false},
                      WorldOfOneCase{"tiny-gpt2", "full_shard", 2, true},
                      WorldOfOneCase{"tiny-gpt2", "shard_grad_op", 1, true}),
    [](const ::testing::TestParamInfo<WorldOfOneCase>& info) {
      return (info.param.preset == "tiny" ? std::string("llama_") : std::string("gpt2_")) + info.param.strategy + "_" +
             std::to_string(info.param.accumulation) + (info.param.sync_every ? "_sync" : "_nosync");
    });

// ---- counting on the dryrun over a fake world ---------------------------------------------------

struct Tally : CollectiveObserver, TraceObserver {
  std::map<std::string, int> count;          // "all_gather@world" -> n
  std::map<std::string, uint64_t> bytes;
  Backend* backend = nullptr;
  int max_live_gathered = 0;
  int live_gathered() const {
    int live = 0;
    for (const CachingAllocator::LiveEntry& entry : backend->allocator().live_entries())
      live += entry.name.size() > 16 && entry.name.compare(entry.name.size() - 16, 16, ".weight.gathered") == 0;
    return live;
  }
  void on_collective(const CollectiveRecord& record) override {
    const std::string key = std::string(collective_kind_name(record.kind)) + "@" + record.group + "/" +
                            std::to_string(record.group_size);
    ++count[key];
    bytes[key] += record.bytes;
  }
  void on_op(const OpRecord&) override {}
  // The allocator reports allocations only; a gathered block's count can only rise at one.
  void on_allocation(const AllocationEvent& event) override {
    if (event.name.size() < 16 || event.name.compare(event.name.size() - 16, 16, ".weight.gathered") != 0) return;
    max_live_gathered = std::max(max_live_gathered, live_gathered());
  }
};

struct Counted {
  Tally tally;
  int groups = 0;
  uint64_t gathered_bytes = 0;  // of every group once, compute dtype, padding included
  uint64_t full_grad_bytes = 0;  // of every group once, f32, padding included
};

Counted count_one_step(const std::string& strategy, int accumulation, bool sync_every, int shard_group_size = 0) {
  RunConfig config = small_run("tiny", 2);
  config.dist.strategy = strategy;
  config.dist.sync_every_micro_batch = sync_every;
  config.dist.shard_group_size = shard_group_size;
  const int world_size = 8;
  const FsdpOptions options = resolve_fsdp_options(config.dist, world_size, 4);
  DryrunBackend backend(0, "test");
  FakeCommunicator world(world_size, 3, fsdp_group_sizes(options, world_size));
  Counted counted;
  world.set_observer(&counted.tally);
  PrecisionPlan bf16 = fp32();
  bf16.name = "bf16";
  bf16.activation = bf16.compute = DType::bf16;
  auto store = std::make_unique<FsdpParameterStore>(backend, config.model, DType::bf16, DType::f32, world, options);
  store->initialize(1);
  for (int g = 0; g < static_cast<int>(store->layout().groups.size()); ++g) {
    counted.gathered_bytes += static_cast<uint64_t>(store->shard_numel(g) * options.shard_group_size) * 2;
    counted.full_grad_bytes += static_cast<uint64_t>(store->shard_numel(g) * options.shard_group_size) * 4;
  }
  counted.groups = static_cast<int>(store->layout().groups.size());
  counted.tally.backend = &backend;
  backend.set_observer(&counted.tally);
  TrainingSession session(config, backend, bf16, std::move(store));
  const int64_t rows = config.train.micro_batch_size * config.train.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(rows), 1);
  std::vector<TokenBatch> batches(static_cast<size_t>(accumulation),
                                  TokenBatch{tokens.data(), tokens.data(), config.train.micro_batch_size,
                                             config.train.seq_len});
  session.step(batches, rows * accumulation * world_size, 1e-3, 1);
  EXPECT_EQ(world.outstanding(), 0u) << "a collective on the world was never waited for";
  EXPECT_EQ(counted.tally.live_gathered(), 0) << "gathered weights outlive the step";
  return counted;
}

TEST(FsdpSchedule, FullShardGathersTwiceAndReducesEveryMicroBatch) {
  Counted c = count_one_step("full_shard", 2, true);
  const int G = c.groups;  // embed, 2 blocks, head
  // Forward gathers every group (the head as part of the loss); backward re-gathers all but the head.
  EXPECT_EQ(c.tally.count["all_gather@world/8"], 2 * (2 * G - 1));
  EXPECT_EQ(c.tally.count["reduce_scatter@world/8"], 2 * G);
  EXPECT_EQ(c.tally.bytes["reduce_scatter@world/8"], 2 * c.full_grad_bytes);
  EXPECT_EQ(c.tally.count["all_reduce@world/8"], 1);  // the gradient norm
  EXPECT_LE(c.tally.max_live_gathered, 2) << "full_shard keeps one block and one prefetch";
}

TEST(FsdpSchedule, FullShardWithoutSyncReducesOnlyTheLastMicroBatch) {
  Counted c = count_one_step("full_shard", 3, false);
  EXPECT_EQ(c.tally.count["all_gather@world/8"], 3 * (2 * c.groups - 1));
  EXPECT_EQ(c.tally.count["reduce_scatter@world/8"], c.groups);
}

TEST(FsdpSchedule, ShardGradOpGathersOncePerMicroBatch) {
  Counted c = count_one_step("shard_grad_op", 2, true);
  EXPECT_EQ(c.tally.count["all_gather@world/8"], 2 * c.groups);
  EXPECT_EQ(c.tally.bytes["all_gather@world/8"], 2 * c.gathered_bytes);
  EXPECT_EQ(c.tally.count["reduce_scatter@world/8"], 2 * c.groups);
  EXPECT_EQ(c.tally.max_live_gathered, c.groups) << "ZeRO-2 holds every block from forward to its backward";
}

TEST(FsdpSchedule, NoShardAllReducesEachGroupOncePerStep) {
  Counted c = count_one_step("no_shard", 2, true);
  EXPECT_EQ(c.tally.count["all_gather@world/8"], 0);
  EXPECT_EQ(c.tally.count["reduce_scatter@world/8"], 0);
  EXPECT_EQ(c.tally.count["all_reduce@replicate/8"], c.groups);
  EXPECT_EQ(c.tally.bytes["all_reduce@replicate/8"], c.full_grad_bytes);
  EXPECT_EQ(c.tally.max_live_gathered, 0);
}

TEST(FsdpSchedule, HybridShardReducesInTheGroupThenAcrossReplicas) {
  Counted c = count_one_step("hybrid_shard", 1, true);  // shard groups of 4 (local world), 2 replicas
  EXPECT_EQ(c.tally.count["all_gather@shard/4"], 2 * c.groups - 1);
  EXPECT_EQ(c.tally.count["reduce_scatter@shard/4"], c.groups);
  EXPECT_EQ(c.tally.count["all_reduce@replicate/2"], c.groups);
  EXPECT_EQ(c.tally.bytes["all_reduce@replicate/2"], c.full_grad_bytes / 4);  // one slice each
  EXPECT_EQ(c.tally.count["all_reduce@shard/4"], 1);  // the norm, over the shard group only
}

TEST(FsdpSchedule, BfloatReductionHalvesTheTraffic) {
  RunConfig config = small_run("tiny", 2);
  config.dist.reduce_dtype = "bf16";
  const FsdpOptions options = resolve_fsdp_options(config.dist, 8, 8);
  EXPECT_EQ(options.reduce_dtype, DType::bf16);
  DryrunBackend backend(0, "test");
  FakeCommunicator world(8, 0, fsdp_group_sizes(options, 8));
  Tally tally;
  world.set_observer(&tally);
  auto store = std::make_unique<FsdpParameterStore>(backend, config.model, DType::bf16, DType::f32, world, options);
  uint64_t full = 0;
  for (int g = 0; g < static_cast<int>(store->layout().groups.size()); ++g) full += store->shard_numel(g) * 8 * 2;
  PrecisionPlan bf16 = fp32();
  bf16.activation = bf16.compute = DType::bf16;
  TrainingSession session(config, backend, bf16, std::move(store));
  std::vector<int32_t> tokens(static_cast<size_t>(config.train.micro_batch_size * config.train.seq_len), 1);
  session.step({TokenBatch{tokens.data(), tokens.data(), config.train.micro_batch_size, config.train.seq_len}},
               static_cast<int64_t>(tokens.size()) * 8, 1e-3, 1);
  EXPECT_EQ(tally.bytes["reduce_scatter@world/8"], full);
}

TEST(FsdpLayout, SlicesOfAllRanksTileEveryGroup) {
  RunConfig config = small_run("tiny-gpt2", 2);
  for (int world_size : {1, 3, 8}) {
    DistConfig dist;
    const FsdpOptions options = resolve_fsdp_options(dist, world_size, world_size);
    const ModelLayout layout = build_layout(config.model);
    std::vector<std::vector<int64_t>> covered(layout.groups.size());
    std::vector<int64_t> decayed(layout.groups.size(), 0);
    for (int rank = 0; rank < world_size; ++rank) {
      DryrunBackend backend(0, "test");
      FakeCommunicator world(world_size, rank, fsdp_group_sizes(options, world_size));
      FsdpParameterStore store(backend, config.model, DType::f32, DType::f32, world, options);
      for (const ParamShard& shard : store.shards()) {
        EXPECT_EQ(shard.master.numel(), shard.count);
        EXPECT_EQ(shard.begin, store.shard_numel(shard.group) * rank) << "rank " << rank << " group " << shard.group;
        covered[static_cast<size_t>(shard.group)].push_back(shard.count);
        decayed[static_cast<size_t>(shard.group)] += shard.decay_count;
      }
    }
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      int64_t total = 0;
      for (int64_t count : covered[g]) total += count;
      EXPECT_EQ(total, layout.groups[g].numel) << "world " << world_size << " group " << layout.groups[g].name;
      EXPECT_EQ(decayed[g], layout.groups[g].decay_numel) << "world " << world_size << " group " << g;
    }
  }
}

TEST(FsdpOptions, BadMeshesAndDtypesAreConfigErrorsNamingTheKey) {
  DistConfig dist;
  dist.strategy = "hybrid_shard";
  dist.shard_group_size = 3;
  try {
    resolve_fsdp_options(dist, 8, 4);
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::config);
    EXPECT_NE(error.full_message().find("dist.shard_group_size = 3"), std::string::npos) << error.full_message();
  }
  dist.shard_group_size = 0;
  EXPECT_EQ(resolve_fsdp_options(dist, 8, 4).shard_group_size, 4);
  EXPECT_EQ(fsdp_group_sizes(resolve_fsdp_options(dist, 8, 4), 8).at("replicate"), 2);
  dist.strategy = "full_shard";
  dist.reduce_dtype = "f16";
  EXPECT_THROW(resolve_fsdp_options(dist, 8, 4), Error);
  dist.reduce_dtype = "f32";
  dist.strategy = "no_shard";
  EXPECT_EQ(resolve_fsdp_options(dist, 8, 4).shard_group_size, 1);
}

}  // namespace
}  // namespace mxtrain
