// The planner's memory oracle: the dryrun of a training step allocates exactly what the cpu
// backend allocates when it really runs that step — the same TrainingSession, store, model and
// recompute policy — so peak live bytes, peak reserved bytes and the allocation count are equal
// to the byte, for both families, every recompute policy, chunked logits and gradient
// accumulation (where the dryrun runs two micro-batches for the real run's three).
#include <gtest/gtest.h>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/train/precision.hpp"
#include "mxtrain/train/session.hpp"
#include "plan/plan_test_support.hpp"

namespace mxtrain {
namespace {

struct ParityCase {
  std::string family, recompute;
  int64_t micro, seq, global, logits_chunk;
  std::string name() const {
    return family + "_" + recompute + "_mb" + std::to_string(micro) + "_seq" + std::to_string(seq) + "_global" +
           std::to_string(global) + "_chunk" + std::to_string(logits_chunk);
  }
};

// Runs `steps` real training steps on the cpu backend and returns its allocator's statistics.
MemoryStats run_on_cpu(const RunConfig& config, int steps) {
  std::unique_ptr<Backend> backend = create_backend("cpu", backend_options(config));
  const PrecisionPlan precision = resolve_precision(config.train.precision, "cpu", false);
  TrainingSession session(config, *backend, precision, make_parameter_store(*backend, config, precision, nullptr, 1));
  const int64_t micro = config.train.micro_batch_size, seq = config.train.seq_len;
  const int64_t global = config.train.global_batch_size ? config.train.global_batch_size : micro;
  std::vector<int32_t> tokens(static_cast<size_t>(micro * seq)), targets(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    tokens[i] = static_cast<int32_t>((i * 37 + 11) % static_cast<size_t>(config.model.vocab_size));
    targets[i] = static_cast<int32_t>((i * 53 + 5) % static_cast<size_t>(config.model.vocab_size));
  }
  const std::vector<TokenBatch> batches(static_cast<size_t>(global / micro),
                                        TokenBatch{tokens.data(), targets.data(), micro, seq});
  for (int step = 1; step <= steps; ++step) session.step(batches, global * seq, 1e-3, step);
  return backend->memory_stats();
}

class DryrunParity : public ::testing::TestWithParam<ParityCase> {};

TEST_P(DryrunParity, PeakAndReservedBytesEqualTheCpuRun) {
  const ParityCase& c = GetParam();
  RunConfig config = test::small_run(c.family, c.recompute, c.micro, c.seq, c.global);
  config.train.logits_chunk_tokens = c.logits_chunk;
  const int steps = 2;
  const MemoryStats cpu = run_on_cpu(config, steps);
  const StepTrace dryrun = test::cpu_equivalent_trace(config, steps);
  EXPECT_EQ(dryrun.memory.peak_live_bytes, cpu.peak_live_bytes);
  EXPECT_EQ(dryrun.memory.peak_reserved_bytes, cpu.peak_reserved_bytes);
  EXPECT_EQ(dryrun.memory.live_bytes, cpu.live_bytes);
  // The dryrun traces min(A, 2) micro-batches: with more, the allocation counts differ, the
  // peaks must not.
  if (c.global / c.micro <= 2) EXPECT_EQ(dryrun.memory.allocations, cpu.allocations);
  // The planner's snapshot of the peak is the allocator's peak, and its buffers add up to it.
  EXPECT_EQ(dryrun.peak.live_bytes, cpu.peak_live_bytes);
  size_t listed = 0;
  for (const CachingAllocator::LiveEntry& entry : dryrun.peak.entries) listed += entry.bytes;
  EXPECT_EQ(listed, cpu.peak_live_bytes);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, DryrunParity,
    ::testing::Values(ParityCase{"llama", "none", 2, 16, 2, 8192}, ParityCase{"llama", "selective", 2, 16, 2, 8192},
                      ParityCase{"llama", "full", 2, 16, 2, 8192}, ParityCase{"llama", "2", 2, 16, 2, 8192},
                      ParityCase{"llama", "none", 1, 32, 3, 8192}, ParityCase{"llama", "selective", 2, 24, 4, 7},
                      ParityCase{"gpt2", "none", 2, 16, 2, 8192}, ParityCase{"gpt2", "selective", 2, 16, 2, 8192},
                      ParityCase{"gpt2", "full", 2, 16, 2, 8192}, ParityCase{"gpt2", "1", 2, 16, 2, 8192},
                      ParityCase{"gpt2", "full", 1, 32, 2, 5}),
    [](const ::testing::TestParamInfo<ParityCase>& info) { return info.param.name(); });

}  // namespace
}  // namespace mxtrain
