// The accuracy harness's calibration fit and config entries: step times generated from known
// factors (GEMM x1.3, attention x0.8, memory-bound x1.1, the calibration's own cost per launch,
// which the fit holds) are fitted back exactly, and the overlay divides the efficiency fractions
// by those factors; an entry's config
// is the defaults plus its "set" keys, whatever the environment; and the allocation-trace
// comparison (run against the cuda backend on the GPU) finds the first replayed allocation the
// reference does not make.
#include <gtest/gtest.h>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/plan/accuracy.hpp"
#include "mxtrain/train/session.hpp"
#include "plan/plan_test_support.hpp"

namespace mxtrain {
namespace {

nlohmann::json synthetic_report() {
  const double launch_s = Calibration::load().for_gpu(require_gpu("h200")).launch_overhead_s;
  nlohmann::json entries = nlohmann::json::array();
  const double shapes[][4] = {{0.10, 0.02, 0.010, 800},  {0.50, 0.05, 0.030, 1500}, {0.02, 0.001, 0.020, 900},
                              {0.30, 0.20, 0.050, 2000}, {0.05, 0.010, 0.040, 3000}, {1.00, 0.30, 0.100, 1200}};
  for (const auto& s : shapes) {
    const double step_s = 1.3 * s[0] + 0.8 * s[1] + 1.1 * s[2] + launch_s * s[3];
    entries.push_back({{"name", "x"},
                       {"predicted",
                        {{"gemm_s", s[0]}, {"attention_s", s[1]}, {"memory_bound_s", s[2]}, {"op_launches", s[3]},
                         {"communication_exposed_s", 0.0}}},
                       {"measured", {{"fits", true}, {"step_ms", 1e3 * step_s}}}});
  }
  return {{"gpu", "h200"}, {"gpu_name", "NVIDIA H200"}, {"commit", "test"}, {"entries", entries}};
}

TEST(AccuracyFit, RecoversTheFactorsThatGeneratedTheSteps) {
  const Calibration calibration = Calibration::load();
  const GpuCalibration current = calibration.for_gpu(require_gpu("h200"));
  const nlohmann::json fit = fit_calibration(synthetic_report(), calibration);
  ASSERT_FALSE(fit.is_null());
  const nlohmann::json& h200 = fit["gpus"]["h200"];
  EXPECT_NEAR(h200["gemm"]["peak_fraction"].get<double>(), current.gemm_peak_fraction / 1.3, 1e-9);
  EXPECT_NEAR(h200["attention"]["forward_fraction"].get<double>(), current.attention_forward_fraction / 0.8, 1e-9);
  EXPECT_NEAR(h200["attention"]["backward_fraction"].get<double>(), current.attention_backward_fraction / 0.8, 1e-9);
  EXPECT_NEAR(h200["memory"]["bandwidth_fraction"].get<double>(), current.bandwidth_fraction / 1.1, 1e-9);
  // The per-launch cost is held: only the smallest configs see it, too few to fit it stably.
  EXPECT_NEAR(h200["launch_overhead_s"].get<double>(), current.launch_overhead_s, 1e-15);
  EXPECT_EQ(h200["step_time_scale"].get<double>(), 1.0);
  // The overlay is a valid layer over the committed calibration.
  const Calibration updated = Calibration::from_json({calibration.merged(), fit});
  EXPECT_NEAR(updated.for_gpu(require_gpu("h200")).gemm_peak_fraction, current.gemm_peak_fraction / 1.3, 1e-9);
}

TEST(AccuracyFit, TooFewMeasurementsGiveNoFit) {
  nlohmann::json report = synthetic_report();
  while (report["entries"].size() > 3) report["entries"].erase(report["entries"].size() - 1);
  EXPECT_TRUE(fit_calibration(report, Calibration::load()).is_null());
}

TEST(AccuracyEntry, ConfigIsDefaultsPlusTheSetKeys) {
  const nlohmann::json entry = {{"name", "e"},
                                {"set",
                                 {{"train.seq_len", 2048},
                                  {"model.preset", "llama-1b"},
                                  {"train.recompute", "full"},
                                  {"train.tf32", true}}}};
  const RunConfig config = accuracy_entry_config(entry);
  EXPECT_EQ(config.model.preset, "llama-1b");
  EXPECT_EQ(config.model.hidden, 2048);
  EXPECT_EQ(config.train.seq_len, 2048);
  EXPECT_EQ(config.train.recompute, "full");
  EXPECT_TRUE(config.train.tf32);
  EXPECT_EQ(config.train.micro_batch_size, RunConfig().train.micro_batch_size);
  // A report's defaults_at_measurement apply under the entry's own keys.
  const nlohmann::json then = {{"train.logits_chunk_tokens", 8192}, {"train.seq_len", 4096},
                               {"precision.quantized_weights", "false"}};
  const RunConfig pinned = accuracy_entry_config(entry, then);
  EXPECT_EQ(pinned.train.logits_chunk_tokens, 8192);
  EXPECT_EQ(pinned.train.seq_len, 2048);
  EXPECT_EQ(pinned.precision.quantized_weights, "false");
  EXPECT_EQ(config.precision.quantized_weights, "auto");
  EXPECT_EQ(defaults_at_measurement(nlohmann::json::object()), nlohmann::json::object());
  EXPECT_THROW(defaults_at_measurement({{"defaults_at_measurement", 3}}), Error);
}

TEST(AllocationTrace, IdenticalWithoutReplayAndFirstDifferenceWithIt) {
  const RunConfig config = test::small_run("llama", "selective", 2, 16, 2);
  std::unique_ptr<Backend> cpu = create_backend("cpu", backend_options(config));
  CudaAllocationModel none;
  const nlohmann::json same = compare_allocation_traces(*cpu, config, require_gpu("h200"), none);
  EXPECT_TRUE(same["match"].get<bool>()) << same.dump();
  EXPECT_GT(same["reference_allocations"].get<int>(), 0);
  // The cpu backend allocates no workspaces; the cuda replay starts with cuBLASLt's 32 MiB and
  // the 4 KiB of reduction partials, so the very first allocation already sits that much higher.
  std::unique_ptr<Backend> cpu_again = create_backend("cpu", backend_options(config));
  CudaAllocationModel replay;
  replay.enabled = true;
  const nlohmann::json differ = compare_allocation_traces(*cpu_again, config, require_gpu("h200"), replay);
  ASSERT_FALSE(differ["match"].get<bool>());
  const nlohmann::json& first = differ["first_difference"];
  EXPECT_EQ(first["index"], 0) << differ.dump();
  EXPECT_EQ(first["reference"]["name"], first["dryrun"]["name"]);
  EXPECT_EQ(first["dryrun"]["live_after"].get<uint64_t>() - first["reference"]["live_after"].get<uint64_t>(),
            (uint64_t{32} << 20) + 4096);
  EXPECT_GT(differ["dryrun_allocations"].get<int>(), differ["reference_allocations"].get<int>());
}

}  // namespace
}  // namespace mxtrain
