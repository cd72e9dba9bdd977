// The plan says what a quantized precision runs as on the planned GPU and whether that path has
// been measured: only an H200 has run mxtrain, so Blackwell's native MXFP8/NVFP4 (and FP8) GEMMs
// are compiled but unmeasured, and the block formats run emulated on Hopper.
#include <gtest/gtest.h>

#include "mxtrain/plan/planner.hpp"
#include "plan_test_support.hpp"

namespace mxtrain {
namespace {

Plan small_plan(const std::string& precision, const std::string& gpu) {
  RunConfig config = test::small_run("llama", "none", 2, 32);
  config.train.device = "cuda";
  config.train.precision = precision;
  return make_plan(config, PlanTarget{gpu, 1, 1}, Calibration::load());
}

std::string path_of(const Plan& plan) { return plan_json(plan)["precision_path"].get<std::string>(); }

TEST(PrecisionPath, BlockFormatsRunEmulatedAndMeasuredOnTheH200) {
  for (const char* precision : {"mxfp8", "nvfp4"}) {
    const Plan plan = small_plan(precision, "h200");
    EXPECT_EQ(path_of(plan), "emulated on sm_90 (quantize, dequantize, BF16 GEMM): measured on an H200") << precision;
    EXPECT_NE(format_plan(plan).find(std::string(precision) + " runs as emulated on sm_90"), std::string::npos);
  }
}

TEST(PrecisionPath, BlackwellNativePathsAreCompiledButUnmeasured) {
  for (const char* gpu : {"b200", "b300"}) {
    for (const char* precision : {"mxfp8", "nvfp4", "fp8"}) {
      const std::string path = path_of(small_plan(precision, gpu));
      EXPECT_NE(path.find(std::string(precision) == "fp8" ? "per-tensor FP8 cuBLASLt GEMMs on sm_10"
                                                          : "native block-scaled cuBLASLt GEMMs on sm_10"),
                std::string::npos)
          << gpu << " " << precision << ": " << path;
      EXPECT_NE(path.find("compiled, never run"), std::string::npos) << path;
      EXPECT_NE(path.find("unmeasured"), std::string::npos) << path;
    }
  }
}

// The H100 ran the accuracy set (per-tensor FP8 among it), not the emulated block formats.
TEST(PrecisionPath, H100NamesTheGpuItWasMeasuredOn) {
  EXPECT_EQ(path_of(small_plan("fp8", "h100")), "per-tensor FP8 cuBLASLt GEMMs on sm_90: measured on an H100");
  EXPECT_EQ(path_of(small_plan("mxfp8", "h100")),
            "emulated on sm_90 (quantize, dequantize, BF16 GEMM): measured on an H200, not on NVIDIA H100 80GB HBM3 (the "
            "casts priced with the H200's fractions)");
}

TEST(PrecisionPath, HighPrecisionHasNoPathLine) {
  for (const char* gpu : {"h200", "b200"}) {
    const Plan plan = small_plan("bf16", gpu);
    EXPECT_EQ(path_of(plan), "");
    EXPECT_EQ(format_plan(plan).find("runs as"), std::string::npos);
  }
}

}  // namespace
}  // namespace mxtrain
