// The distributed path on one GPU (the GPU machine has one; several GPUs are issue 7's): NCCL
// collectives over a one-rank communicator on device buffers, on the backend's stream; the FSDP
// store over NCCL training like the local store; and the real binary — `train` with
// dist.backend = nccl, and `mxtrain launch --nproc-per-node 1` with a SIGTERM that the rank
// survives with a checkpoint.
#include <csignal>

#include "cuda/cuda_test_support.hpp"
#include "distributed/process_helpers.hpp"
#include "mxtrain/distributed/communicator_factory.hpp"
#include "mxtrain/distributed/fsdp_store.hpp"
#include "mxtrain/train/precision.hpp"
#include "mxtrain/train/session.hpp"

namespace mxtrain::test {
namespace {

class NcclOneRank : public CudaTest {
 protected:
  std::unique_ptr<Communicator> world() {
    runtime::RankEnvironment single;
    return create_world_communicator("nccl", single, cuda());
  }
};

TEST_F(NcclOneRank, CollectivesFollowTheComputeStream) {
  std::unique_ptr<Communicator> nccl = world();
  ASSERT_EQ(nccl->name(), "nccl");
  EXPECT_EQ(nccl->size(), 1);
  const std::vector<float> values = random_as(1000, 3, DType::bf16);
  Buffer shard = upload(cuda(), values, Shape{1000}, DType::bf16);
  Buffer gathered = cuda().allocate("gathered", Shape{1000}, DType::bf16, Lifetime::communication);
  cuda().fill(gathered, 0.0f);  // queued before the gather: the gather must see it done
  nccl->wait(nccl->all_gather(shard, gathered));
  EXPECT_EQ(download(cuda(), gathered), values);

  Buffer full = upload(cuda(), values, Shape{1000});
  Buffer reduced = cuda().allocate("reduced", Shape{1000}, DType::f32, Lifetime::communication);
  nccl->wait(nccl->reduce_scatter(full, reduced, ReduceOp::sum));
  cuda().scale(reduced, 2.0f);  // after wait(): runs on the reduced values
  std::vector<float> doubled = values;
  for (float& v : doubled) v *= 2.0f;
  EXPECT_EQ(download(cuda(), reduced), doubled);

  nccl->wait(nccl->all_reduce(full, ReduceOp::average));
  nccl->wait(nccl->broadcast(full, 0));
  EXPECT_EQ(download(cuda(), full), values);
  EXPECT_EQ(nccl->all_reduce_scalar(4.5, ReduceOp::sum), 4.5);
  nccl->barrier();
  std::unique_ptr<Communicator> child = nccl->split(0, 0, "shard");
  EXPECT_EQ(child->group(), "shard");
  child->wait(child->all_reduce(full, ReduceOp::sum));
  EXPECT_EQ(download(cuda(), full), values);
}

TEST_F(NcclOneRank, FsdpOverNcclTrainsLikeTheLocalStore) {
  RunConfig config;
  config.model.hidden = 128;
  config.model.heads = 2;
  config.model.kv_heads = 1;
  config.model.layers = 2;
  config.model.ffn_hidden = 256;
  config.train.micro_batch_size = 2;
  config.train.global_batch_size = 4;  // two micro-batches a step (f32 gradients in both stores)
  config.train.seq_len = 64;
  config.train.device = "cuda";
  const PrecisionPlan precision = resolve_precision("bf16", "cuda", false);
  const int64_t rows = config.train.micro_batch_size * config.train.seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(rows)), targets(static_cast<size_t>(rows));
  for (int64_t i = 0; i < rows; ++i) {
    tokens[i] = static_cast<int32_t>((i * 37 + 11) % config.model.vocab_size);
    targets[i] = static_cast<int32_t>((i * 53 + 5) % config.model.vocab_size);
  }
  const std::vector<TokenBatch> batches(2, TokenBatch{tokens.data(), targets.data(), config.train.micro_batch_size,
                                                      config.train.seq_len});
  auto run = [&](Communicator* world) {
    TrainingSession session(config, cuda(), precision, make_parameter_store(cuda(), config, precision, world, 1));
    std::vector<double> losses;
    for (int step = 1; step <= 4; ++step) losses.push_back(session.step(batches, 2 * rows, 3e-3, step).loss);
    return losses;
  };
  const std::vector<double> local = run(nullptr);
  std::unique_ptr<Communicator> nccl = world();
  for (const std::string strategy : {"full_shard", "shard_grad_op", "no_shard"}) {
    config.dist.strategy = strategy;
    const std::vector<double> sharded = run(nccl.get());
    for (size_t i = 0; i < local.size(); ++i) {
      std::printf("[ loss  ] %-13s step %zu: local %.6f, fsdp over nccl %.6f\n", strategy.c_str(), i + 1, local[i],
                  sharded[i]);
      // Same inputs and the deterministic backend: only kernels' own nondeterminism may differ.
      EXPECT_NEAR(sharded[i], local[i], 1e-3 * local[i]) << strategy << " step " << i + 1;
    }
  }
  EXPECT_LT(local.back(), local.front());
}

class OneGpuProcesses : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    corpus_ = make_test_corpus(dir_.file("corpus"));
  }
  std::string flags(const std::string& run) const {
    std::string text = tiny_train_flags(corpus_, run);
    return text.replace(text.find("-d cpu"), 6, "-d cuda");
  }
  TempDir dir_;
  std::string corpus_;
};

TEST_F(OneGpuProcesses, TrainOverNcclAndThroughTheLauncher) {
  std::string output;
  ASSERT_EQ(run_command(binary_path() + " train " + flags(dir_.file("local")) + " --steps 8", &output), 0) << output;
  ASSERT_EQ(run_command(binary_path() + " train " + flags(dir_.file("nccl")) +
                            " --steps 8 --set dist.backend=nccl --strategy full_shard",
                        &output),
            0)
      << output;
  EXPECT_NE(output.find("FSDP full_shard over 1 rank"), std::string::npos) << output;
  EXPECT_NE(output.find("nccl"), std::string::npos) << output;
  ASSERT_EQ(run_command(binary_path() + " launch --nproc-per-node 1 --log-dir " + dir_.file("logs") + " -- train " +
                            flags(dir_.file("launched")) + " --steps 8 --set dist.backend=nccl",
                        &output),
            0)
      << output;
  EXPECT_NE(output.find("all 1 rank(s) finished"), std::string::npos) << output;
  const std::map<int64_t, double> local = step_losses(dir_.file("local"));
  ASSERT_EQ(local.size(), 8u);
  for (const std::string run : {"nccl", "launched"}) {
    const std::map<int64_t, double> got = step_losses(dir_.file(run));
    ASSERT_EQ(got.size(), 8u) << run;
    for (const auto& [step, loss] : local) EXPECT_NEAR(got.at(step), loss, 1e-3 * loss) << run << " step " << step;
  }
}

TEST_F(OneGpuProcesses, SigtermThroughTheLauncherSavesOnTheGpu) {
  const std::string run = dir_.file("run");
  BackgroundProcess launcher(binary_path() + " launch --nproc-per-node 1 --log-dir " + dir_.file("logs") +
                                 " -- train " + flags(run) + " --steps 1000000 --set dist.backend=nccl",
                             dir_.file("launch.txt"));
  wait_until([&] { return step_losses(run).size() >= 3 || launcher.wait(0).has_value(); }, 300);
  ASSERT_FALSE(launcher.wait(0).has_value()) << launcher.output();
  launcher.signal(SIGTERM);
  std::optional<int> status = launcher.wait(100);
  ASSERT_TRUE(status.has_value()) << launcher.output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << launcher.output();
  std::vector<std::string> saved = complete_checkpoints(run);
  ASSERT_EQ(saved.size(), 1u) << launcher.output();
  std::string output;
  const int64_t stopped_at = checkpoint_step(saved.back());
  ASSERT_EQ(run_command(binary_path() + " train " + flags(run) + " --set dist.backend=nccl --steps " +
                            std::to_string(stopped_at + 2),
                        &output),
            0)
      << output;
  EXPECT_NE(output.find("resumed from"), std::string::npos) << output;
  EXPECT_EQ(step_losses(run).size(), static_cast<size_t>(stopped_at + 2));
}

}  // namespace
}  // namespace mxtrain::test
