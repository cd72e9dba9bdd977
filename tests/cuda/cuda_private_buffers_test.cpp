// The cuda backend's allocation trace against the dryrun's, request by request: two training
// steps of small Llama- and GPT-2-style configs (a couple of batch and recompute settings) on the
// GPU and on the dryrun with the CUDA allocation model, every allocate and release through the
// shared caching allocator (CachingAllocator::set_trace_hook) compared by name, lifetime,
// requested and charged bytes and the live and reserved bytes after it, then the peaks.
//
//   CudaAllocationParity.TraceMatchesDryrunWithTheDevicesFacts/*  the dryrun sized with the
//       device facts the cuda run reported (CudaBackend::device_facts(): each SDPA plan's
//       workspace, cub's sort storage): the shared description (backend/private_buffers.hpp)
//       and everything else must give the same trace byte for byte.
//   CudaAllocationParity.PlannedPeakMatchesWithTheCalibration/*  the dryrun as the planner
//       runs it (the committed calibration's modelled facts): every modelled fact is printed
//       next to the device's, and the peak live and reserved bytes must be the device's.
#include <algorithm>
#include <cstdio>

#include "cuda/cuda_test_support.hpp"
#include "mxtrain/backend/dryrun/dryrun_backend.hpp"
#include "mxtrain/hw/gpu_catalog.hpp"
#include "mxtrain/plan/calibration.hpp"
#include "mxtrain/train/precision.hpp"
#include "mxtrain/train/session.hpp"

namespace mxtrain::test {
namespace {

struct ParityCase {
  const char* name;
  const char* family;  // llama | gpt2
  const char* recompute;
  int64_t micro, accumulation;
  bool deterministic;
  bool quack_gelu = false;  // GPT-2's GELU GEMMs as quack's: the DGELU GEMM sums the bias gradient
};

RunConfig parity_config(const ParityCase& c) {
  RunConfig config;
  const bool llama = std::string(c.family) == "llama";
  config.model = model_preset(llama ? "tiny" : "tiny-gpt2");
  config.model.hidden = 128;
  config.model.heads = 4;
  config.model.kv_heads = llama ? 2 : 4;  // grouped-query heads on Llama
  config.model.layers = 2;
  config.model.ffn_hidden = llama ? 352 : 512;
  config.model.max_seq_len = 128;
  config.train.device = "cuda";
  config.train.precision = "bf16";
  config.train.recompute = c.recompute;
  config.train.micro_batch_size = c.micro;
  config.train.seq_len = 128;
  config.train.global_batch_size = c.micro * c.accumulation;
  config.train.deterministic = c.deterministic;
  config.train.cuda_graph = false;  // a replayed step allocates nothing; the dryrun cannot capture
  config.train.gemm_autotune = false;
  return config;
}

struct Trace {
  std::vector<CachingAllocator::LiveEntry> at_start;  // the backend's own workspaces
  std::vector<CachingAllocator::TraceEvent> events;
  MemoryStats stats;
};

// Two steps of `config` on `backend`, every allocator event recorded.
Trace record_steps(Backend& backend, const RunConfig& config) {
  Trace trace;
  trace.at_start = backend.allocator().live_entries();
  backend.allocator().set_trace_hook(
      [&trace](const CachingAllocator::TraceEvent& event) { trace.events.push_back(event); });
  {
    const PrecisionPlan precision = resolve_precision(config, backend);
    TrainingSession session(config, backend, precision, make_parameter_store(backend, config, precision, nullptr, 1));
    const int64_t micro = config.train.micro_batch_size, seq = config.train.seq_len;
    const int64_t global = config.train.global_batch(1);
    std::vector<int32_t> tokens(static_cast<size_t>(micro * seq)), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>((i * 7919) % static_cast<size_t>(config.model.vocab_size));
      targets[i] = static_cast<int32_t>((i * 104729 + 1) % static_cast<size_t>(config.model.vocab_size));
    }
    const std::vector<TokenBatch> batches(static_cast<size_t>(global / micro),
                                          TokenBatch{tokens.data(), targets.data(), micro, seq});
    for (int step = 1; step <= 2; ++step) session.step(batches, global * seq, config.optimizer.lr, step);
    backend.synchronize();
  }
  backend.allocator().set_trace_hook({});
  trace.stats = backend.memory_stats();
  return trace;
}

std::string describe(const CachingAllocator::TraceEvent& event) {
  return strf("%s %s (%s) requested %zu, charged %zu, live after %zu, reserved after %zu",
              event.is_free ? "free" : "allocate", event.name.c_str(), lifetime_name(event.lifetime),
              event.bytes_requested, event.bytes, event.live_bytes_after, event.reserved_bytes_after);
}

// Byte for byte; the first difference is printed with the events around it.
void expect_same_trace(const Trace& cuda, const Trace& dryrun) {
  ASSERT_EQ(cuda.at_start.size(), dryrun.at_start.size());
  for (size_t i = 0; i < cuda.at_start.size(); ++i) {
    EXPECT_EQ(cuda.at_start[i].name, dryrun.at_start[i].name);
    EXPECT_EQ(cuda.at_start[i].bytes, dryrun.at_start[i].bytes) << cuda.at_start[i].name;
    EXPECT_EQ(cuda.at_start[i].lifetime, dryrun.at_start[i].lifetime) << cuda.at_start[i].name;
  }
  std::printf("[ trace ] cuda %zu events, dryrun %zu\n", cuda.events.size(), dryrun.events.size());
  const size_t common = std::min(cuda.events.size(), dryrun.events.size());
  for (size_t i = 0; i < common; ++i) {
    const auto& a = cuda.events[i];
    const auto& b = dryrun.events[i];
    const bool same = a.is_free == b.is_free && a.name == b.name && a.lifetime == b.lifetime &&
                      a.bytes_requested == b.bytes_requested && a.bytes == b.bytes &&
                      a.live_bytes_after == b.live_bytes_after && a.reserved_bytes_after == b.reserved_bytes_after;
    if (same) continue;
    for (size_t j = i >= 3 ? i - 3 : 0; j < i; ++j)
      std::printf("[ trace ] %zu both:   %s\n", j, describe(cuda.events[j]).c_str());
    ADD_FAILURE() << "event " << i << " differs\n  cuda:   " << describe(a) << "\n  dryrun: " << describe(b);
    return;
  }
  ASSERT_EQ(cuda.events.size(), dryrun.events.size()) << "one trace is a prefix of the other";
  EXPECT_EQ(cuda.stats.peak_live_bytes, dryrun.stats.peak_live_bytes);
  EXPECT_EQ(cuda.stats.peak_reserved_bytes, dryrun.stats.peak_reserved_bytes);
  EXPECT_EQ(cuda.stats.live_bytes, dryrun.stats.live_bytes);
  EXPECT_EQ(cuda.stats.allocations, dryrun.stats.allocations);
}

class CudaAllocationParity : public ::testing::TestWithParam<ParityCase> {
 protected:
  void SetUp() override {
    if (!backend_available("cuda")) GTEST_SKIP() << "no CUDA device on this machine";
    config_ = parity_config(GetParam());
    BackendOptions options;
    options.deterministic = config_.train.deterministic;
    options.gemm_autotune = config_.train.gemm_autotune;
    options.gemm_quack_gelu = GetParam().quack_gelu;
    cuda_ = create_backend("cuda", options);
    if (GetParam().quack_gelu && !cuda_->gemm_fuses_dgelu_bias_gradient(DType::bf16, 128, 512))
      GTEST_SKIP() << "quack's DGELU GEMM with the bias gradient needs an sm_90 GPU and a build with its kernels";
    cuda_trace_ = record_steps(*cuda_, config_);
    std::printf("[ trace ] %s: cuda peak live %zu, reserved %zu\n", GetParam().name, cuda_trace_.stats.peak_live_bytes,
                cuda_trace_.stats.peak_reserved_bytes);
  }
  const private_buffers::DeviceFacts& device_facts() const {
    return dynamic_cast<const CudaBackend&>(*cuda_).device_facts();
  }
  // The planner's model of this GPU (plan/step_trace.cpp builds its dryrun the same way).
  CudaAllocationModel planner_model() const {
    CudaAllocationModel model = Calibration::load().for_gpu(require_gpu("h200")).cuda_allocations;
    model.deterministic_attention = config_.train.deterministic;
    model.gemm_dgelu_bias_fused = GetParam().quack_gelu;  // as plan/step_trace.cpp sets it on an sm_90
    return model;
  }
  Trace dryrun_trace(const CudaAllocationModel& model, private_buffers::DeviceFacts* used = nullptr) {
    DryrunBackend dryrun(0, "h200", model);
    dryrun.set_native_quantized_gemms(native_quantized_gemms(require_gpu("h200")));
    Trace trace = record_steps(dryrun, config_);
    if (used) *used = dryrun.device_facts_used();
    return trace;
  }

  RunConfig config_;
  std::unique_ptr<Backend> cuda_;
  Trace cuda_trace_;
};

TEST_P(CudaAllocationParity, TraceMatchesDryrunWithTheDevicesFacts) {
  CudaAllocationModel model = planner_model();
  model.recorded = device_facts();
  ASSERT_FALSE(model.recorded.bytes.empty()) << "the cuda run reported no device facts";
  private_buffers::DeviceFacts used;
  const Trace dryrun = dryrun_trace(model, &used);
  // The dryrun asked for exactly the facts the device reported (so none came from the model).
  EXPECT_EQ(used.bytes, device_facts().bytes);
  expect_same_trace(cuda_trace_, dryrun);
}

TEST_P(CudaAllocationParity, PlannedPeakMatchesWithTheCalibration) {
  private_buffers::DeviceFacts modelled;
  const Trace dryrun = dryrun_trace(planner_model(), &modelled);
  for (const auto& [key, bytes] : device_facts().bytes) {
    const std::optional<int64_t> model = modelled.find(key);
    std::printf("[ fact  ] %-60s device %lld, calibration %s\n", key.c_str(), static_cast<long long>(bytes),
                model ? std::to_string(*model).c_str() : "(not asked)");
    EXPECT_TRUE(model.has_value()) << key;
  }
  EXPECT_EQ(modelled.bytes.size(), device_facts().bytes.size());
  std::printf("[ trace ] %s: planned peak live %zu, reserved %zu\n", GetParam().name, dryrun.stats.peak_live_bytes,
              dryrun.stats.peak_reserved_bytes);
  EXPECT_EQ(dryrun.stats.peak_live_bytes, cuda_trace_.stats.peak_live_bytes);
  EXPECT_EQ(dryrun.stats.peak_reserved_bytes, cuda_trace_.stats.peak_reserved_bytes);
}

INSTANTIATE_TEST_SUITE_P(Configs, CudaAllocationParity,
                         ::testing::Values(ParityCase{"llama_b2_none", "llama", "none", 2, 1, false},
                                           ParityCase{"llama_b4x2_full", "llama", "full", 4, 2, false},
                                           ParityCase{"gpt2_b2_selective", "gpt2", "selective", 2, 1, false},
                                           ParityCase{"gpt2_b4_none_deterministic", "gpt2", "none", 4, 1, true},
                                           ParityCase{"gpt2_b2x2_none_quack_gelu", "gpt2", "none", 2, 2, false, true}),
                         [](const ::testing::TestParamInfo<ParityCase>& info) { return std::string(info.param.name); });

}  // namespace
}  // namespace mxtrain::test
