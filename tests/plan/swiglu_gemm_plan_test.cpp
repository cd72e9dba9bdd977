// train.gemm_kernels with quack's gated GEMM (SwiGLU in the gate/up GEMM's epilogue) where no GPU
// is needed: the dry run asks the model's question as the GPU it plans for would answer it
// (Backend::gemm_fuses_swiglu: Hopper, BF16), so the planned step on an H200 has no SwiGLU
// forward kernel and the same memory (the fused GEMM writes the same two buffers, allocated in
// the same order), a Blackwell plan is the cuBLASLt one, FP8 blocks keep their own path, and a
// cpu run names the setting as cuda-only.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mxtrain/backend/dryrun/dryrun_backend.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

nlohmann::json plan(const std::string& args, const std::string& kernels) {
  std::string output;
  EXPECT_EQ(test::run_command(test::binary_path() + " plan -m llama-1b -b 8 -s 2048 " + args +
                                  " --json --set train.gemm_kernels=" + kernels + " 2>/dev/null",
                              &output),
            0)
      << output;
  return nlohmann::json::parse(output);
}

TEST(SwigluGemmPlan, DryrunAnswersAsTheGpuItModels) {
  CudaAllocationModel model;
  model.enabled = true;
  DryrunBackend without(0, "h200", model);
  EXPECT_FALSE(without.gemm_fuses_swiglu(DType::bf16, 2048, 5632));
  model.gemm_swiglu_fused = true;
  DryrunBackend with(0, "h200", model);
  EXPECT_TRUE(with.gemm_fuses_swiglu(DType::bf16, 2048, 5632));
  EXPECT_FALSE(with.gemm_fuses_swiglu(DType::f16, 2048, 5632));
  EXPECT_FALSE(with.gemm_fuses_swiglu(DType::bf16, 2048, 5630));  // rows of 16-byte multiples only
}

TEST(SwigluGemmPlan, PlanCommandPricesTheFusedForward) {
  const nlohmann::json cublaslt = plan("-p bf16 --gpu h200", "cublaslt");
  const nlohmann::json fused = plan("-p bf16 --gpu h200", "cublaslt+quack-swiglu");
  EXPECT_EQ(fused["memory"]["peak_live_bytes"], cublaslt["memory"]["peak_live_bytes"]);
  EXPECT_LT(fused["time"]["memory_bound_s"].get<double>(), cublaslt["time"]["memory_bound_s"].get<double>());
  EXPECT_LT(fused["time"]["step_s"].get<double>(), cublaslt["time"]["step_s"].get<double>());
  // The B200 runs cuBLASLt and the SwiGLU kernel (quack's kernels here are sm_90a code).
  EXPECT_EQ(plan("-p bf16 --gpu b200", "cublaslt+quack-swiglu")["time"]["step_s"],
            plan("-p bf16 --gpu b200", "cublaslt")["time"]["step_s"]);
  // FP8 blocks quantize their GEMMs: nothing to fuse.
  EXPECT_EQ(plan("-p fp8 --gpu h200", "cublaslt+quack-swiglu")["time"]["step_s"],
            plan("-p fp8 --gpu h200", "cublaslt")["time"]["step_s"]);
}

TEST(SwigluGemmPlan, CpuRunNamesItACudaSetting) {
  std::string output;
  test::TempDir dir;
  EXPECT_NE(test::run_command(test::binary_path() + " train -d cpu -m tiny -b 2 -s 160 --steps 1 -o " + dir.file("run") +
                                  " --set train.gemm_kernels=cublaslt+quack-swiglu 2>&1",
                              &output),
            0);
  EXPECT_NE(output.find("train.gemm_kernels = cublaslt+quack-swiglu is a cuda setting"), std::string::npos) << output;
}

}  // namespace
}  // namespace mxtrain
