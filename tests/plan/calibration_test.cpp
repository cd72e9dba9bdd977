// The calibration data and the cost model's primitives: the committed H200 factors reproduce the
// measured ceilings they were fitted to (docs/benchmarking.md: 773 TFLOP/s BF16 GEMM at 8192³, 4.26 TB/s
// copy); layering overrides field by field; an unknown field is an error, never ignored.
#include <gtest/gtest.h>

#include "mxtrain/core/error.hpp"
#include "mxtrain/plan/calibration.hpp"
#include "mxtrain/plan/cost_model.hpp"

namespace mxtrain {
namespace {

// The committed H200 factors are a least-squares fit to whole training steps (the accuracy
// harness). They must stay consistent with the ceilings measured on the same GPU (docs/benchmarking.md):
// the 8192^3 BF16 GEMM within 3% of its measured 773 TFLOP/s, and memory-bound ops no faster
// than the measured 4.26 TB/s device-to-device copy.
TEST(Calibration, CommittedH200FactorsStayConsistentWithTheMeasuredCeilings) {
  const Calibration calibration = Calibration::load();
  const GpuSpec& h200 = require_gpu("h200");
  const GpuCalibration c = calibration.for_gpu(h200);
  OpRecord gemm{OpKind::linear_forward, Phase::forward, DType::bf16, 2.0 * 8192 * 8192 * 8192, 3.0 * 8192 * 8192 * 2};
  gemm.m = gemm.n = gemm.k = 8192;
  const double seconds = op_seconds(gemm, h200, c, false) - c.launch_overhead_s;
  EXPECT_NEAR(gemm.flops / seconds / 1e12, 773.0, 0.03 * 773.0);
  OpRecord copy{OpKind::copy, Phase::other, DType::bf16, 0, 2.0 * 1e9};
  const double copy_seconds = op_seconds(copy, h200, c, false) - c.launch_overhead_s;
  EXPECT_LE(copy.bytes / copy_seconds / 1e12, 4.26);
  EXPECT_GT(copy.bytes / copy_seconds / 1e12, 1.0);
}

TEST(Calibration, TileQuantisationAndShortDepthLowerGemmEfficiency) {
  const GpuSpec& h200 = require_gpu("h200");
  const GpuCalibration c = Calibration::load().for_gpu(h200);
  const double square = gemm_efficiency(8192, 8192, 8192, h200, c);
  // 132 tiles of 128 x 256 fill the 132 SMs in one wave; one more row needs a second wave.
  EXPECT_LT(gemm_efficiency(132 * 128 + 1, 256, 8192, h200, c), 0.7 * gemm_efficiency(132 * 128, 256, 8192, h200, c));
  EXPECT_LT(gemm_efficiency(8192, 8192, 256, h200, c), square);
  // Too few output tiles for the SMs: split-K recovers part of the GPU, not all of it.
  const double one_tile = gemm_efficiency(128, 256, 8192, h200, c);
  EXPECT_LT(one_tile, square * 0.7);
  EXPECT_GT(one_tile, gemm_efficiency(128, 256, 512, h200, c));
}

TEST(Calibration, GpuEntryOverridesDefaultFieldByField) {
  nlohmann::json base = {{"gpus",
                          {{"default",
                            {{"source", "defaults"},
                             {"gemm", {{"peak_fraction", 0.5}, {"k_half", 64}, {"tiles", {{128, 128, 1.0}}}}},
                             {"launch_overhead_s", 1e-6}}},
                           {"h100", {{"gemm", {{"peak_fraction", 0.7}}}}}}}};
  nlohmann::json overlay = {{"gpus", {{"h100", {{"step_time_scale", 1.25}}}}}};
  const Calibration calibration = Calibration::from_json({base, overlay});
  const GpuCalibration h100 = calibration.for_gpu(require_gpu("h100"));
  EXPECT_DOUBLE_EQ(h100.gemm_peak_fraction, 0.7);
  EXPECT_DOUBLE_EQ(h100.gemm_k_half, 64);
  EXPECT_DOUBLE_EQ(h100.step_time_scale, 1.25);
  EXPECT_DOUBLE_EQ(h100.launch_overhead_s, 1e-6);
  const GpuCalibration b200 = calibration.for_gpu(require_gpu("b200"));
  EXPECT_DOUBLE_EQ(b200.gemm_peak_fraction, 0.5);
  EXPECT_DOUBLE_EQ(b200.step_time_scale, 1.0);
  EXPECT_TRUE(b200.cuda_allocations.enabled);
}

TEST(Calibration, UnknownFieldsAndMissingTilesAreErrors) {
  nlohmann::json typo = {{"gpus", {{"default", {{"gemm", {{"peak_fracton", 0.5}, {"tiles", {{128, 128, 1.0}}}}}}}}}};
  try {
    Calibration::from_json({typo}).for_gpu(require_gpu("h200"));
    FAIL() << "a misspelt field must not be ignored";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("gemm.peak_fracton"), std::string::npos) << error.what();
  }
  nlohmann::json no_tiles = {{"gpus", {{"default", {{"gemm", {{"peak_fraction", 0.5}}}}}}}};
  EXPECT_THROW(Calibration::from_json({no_tiles}).for_gpu(require_gpu("h200")), Error);
  EXPECT_THROW(Calibration::from_json({nlohmann::json::object()}), Error);
  EXPECT_THROW(require_gpu("a100"), Error);
}

TEST(CostModel, CollectivesCrossingNodesUseTheSlowerLink) {
  const GpuSpec& h100 = require_gpu("h100");
  const GpuCalibration c = Calibration::load().for_gpu(h100);
  CollectiveRecord gather{CollectiveKind::all_gather, DType::bf16, uint64_t{1} << 30, 8, "world"};
  const double inside = collective_seconds(gather, h100, c, Topology{8, 1});
  gather.group_size = 16;
  const double across = collective_seconds(gather, h100, c, Topology{8, 2});
  EXPECT_GT(across, 5 * inside);
  // Ring traffic: (n-1)/n of the buffer over NVLink at the calibrated fraction.
  EXPECT_NEAR(inside, (7.0 / 8.0) * (1u << 30) / (h100.nvlink_bytes_per_s * c.nvlink_fraction) +
                          c.collective_latency_s * 3,
              1e-9);
  CollectiveRecord reduce{CollectiveKind::all_reduce, DType::f32, uint64_t{1} << 30, 8, "world"};
  EXPECT_NEAR(collective_seconds(reduce, h100, c, Topology{8, 1}) - c.collective_latency_s * 3,
              2 * (inside - c.collective_latency_s * 3), 1e-9);
}

}  // namespace
}  // namespace mxtrain
