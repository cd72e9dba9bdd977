// train.attention_backward = auto and train.gemm_kernels = auto (the defaults): FlashAttention-4's
// backward and quack's gated SwiGLU GEMM (llama) or GELU GEMMs (GPT-2) where the build carries
// them, the GPU is a Hopper and the run allows them; cuDNN's backward and cuBLASLt alone everywhere
// else. What this build carries
// decides the Hopper rows (CI's build carries neither; a build made with MXTRAIN_WITH_FA4=1
// carries both), so each expectation is stated from carried_kernels(). The planner plans what the
// binary would run on the GPU it plans for, and a CPU run takes the defaults without complaint.
#include <gtest/gtest.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/train/session.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

RunConfig load(std::vector<std::pair<std::string, std::string>> overrides) {
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = std::move(overrides);
  return load_config(sources);
}

bool carries_attention(const std::string& tag) {
  const std::vector<std::string> carried = carried_kernels().flash_attention_4;
  return std::find(carried.begin(), carried.end(), tag) != carried.end();
}

TEST(KernelChoice, BothSettingsDefaultToAuto) {
  const RunConfig config = load({});
  EXPECT_EQ(config.train.attention_backward, "auto");
  EXPECT_EQ(config.train.gemm_kernels, "auto");
}

TEST(KernelChoice, AutoAttentionBackwardIsFlashAttention4WhereItCanRun) {
  // llama-1b: head dimension 64, 32 query heads on 4 key/value heads.
  const std::vector<std::pair<std::string, std::string>> llama = {
      {"model.preset", "llama-1b"}, {"train.seq_len", "2048"}, {"train.precision", "bf16"}};
  const std::string hopper = carries_attention("d64_g8") ? "flash-attention-4" : "cudnn";
  EXPECT_EQ(attention_backward_of(load(llama), 90), hopper);
  for (const char* precision : {"fp8", "fp8-current", "mxfp8", "auto"}) {
    auto with = llama;
    with.emplace_back("train.precision", precision);
    EXPECT_EQ(attention_backward_of(load(with), 90), hopper) << precision;
  }
  // Not on another GPU, nor without one; not where the run rules it out.
  EXPECT_EQ(attention_backward_of(load(llama), 100), "cudnn");
  EXPECT_EQ(attention_backward_of(load(llama), 0), "cudnn");
  for (const auto& [key, value] : std::vector<std::pair<std::string, std::string>>{
           {"train.deterministic", "true"}, {"train.precision", "fp16"}, {"train.precision", "fp32"},
           {"train.seq_len", "128"}}) {
    auto with = llama;
    with.emplace_back(key, value);
    EXPECT_EQ(attention_backward_of(load(with), 90), "cudnn") << key << " = " << value;
  }
  // A shape whose kernels no build carries (head dimension 96: kernels are exported for 64 and 128).
  EXPECT_EQ(attention_backward_of(load({{"model.preset", "llama-1b"}, {"model.hidden", "3072"}, {"model.heads", "32"},
                                        {"model.kv_heads", "4"}, {"train.seq_len", "2048"}}),
                                  90),
            "cudnn");
  // An explicit value stays, whatever the GPU.
  auto explicit_cudnn = llama;
  explicit_cudnn.emplace_back("train.attention_backward", "cudnn");
  EXPECT_EQ(attention_backward_of(load(explicit_cudnn), 90), "cudnn");
  auto explicit_fa4 = llama;
  explicit_fa4.emplace_back("train.attention_backward", "flash-attention-4");
  EXPECT_EQ(attention_backward_of(load(explicit_fa4), 0), "flash-attention-4");
}

TEST(KernelChoice, AutoGemmKernelsFuseTheActivationOnAHopperWithTheKernels) {
  const std::string hopper = carried_kernels().quack_gated_gemm ? "cublaslt+quack-swiglu" : "cublaslt";
  EXPECT_EQ(gemm_kernels_of(load({{"model.preset", "llama-1b"}}), 90), hopper);
  EXPECT_EQ(gemm_kernels_of(load({{"model.preset", "llama-1b"}}), 100), "cublaslt");
  EXPECT_EQ(gemm_kernels_of(load({{"model.preset", "llama-1b"}}), 0), "cublaslt");
  // GPT-2: its GELU GEMMs, where the build carries them.
  const std::string gpt2_hopper = carried_kernels().quack_gelu_gemms ? "cublaslt+quack-gelu" : "cublaslt";
  EXPECT_EQ(gemm_kernels_of(load({{"model.preset", "gpt2-124m"}}), 90), gpt2_hopper);
  EXPECT_EQ(gemm_kernels_of(load({{"model.preset", "gpt2-124m"}}), 100), "cublaslt");
  EXPECT_EQ(gemm_kernels_of(load({{"model.preset", "gpt2-124m"}, {"train.deterministic", "true"}}), 90), "cublaslt");
  EXPECT_EQ(gemm_kernels_of(load({{"model.preset", "llama-1b"}, {"train.deterministic", "true"}}), 90), "cublaslt");
  // What each value runs on quack's kernels.
  EXPECT_TRUE(quack_swiglu_in("cublaslt+quack-swiglu") && quack_swiglu_in("cublaslt+quack"));
  EXPECT_TRUE(quack_gelu_in("cublaslt+quack-gelu") && quack_gelu_in("cublaslt+quack"));
  EXPECT_FALSE(quack_swiglu_in("cublaslt+quack-gelu") || quack_gelu_in("cublaslt+quack-swiglu"));
  EXPECT_FALSE(quack_swiglu_in("cublaslt") || quack_gelu_in("cublaslt"));
  EXPECT_EQ(gemm_kernels_of(load({{"model.preset", "llama-1b"}, {"train.gemm_kernels", "cublaslt+quack"}}), 0),
            "cublaslt+quack");
  // The start-up line says what was taken and that auto took it.
  const std::string line = kernels_startup_line(load({{"model.preset", "llama-1b"}}), 100);
  EXPECT_EQ(line, "kernels: attention backward cudnn (auto), GEMMs cublaslt (auto), head loss chunked (auto)");
  EXPECT_EQ(kernels_startup_line(load({{"model.preset", "llama-1b"}, {"train.gemm_kernels", "cublaslt"},
                                       {"train.head_loss", "quack-lce"}}),
                                 90),
            std::string("kernels: attention backward ") +
                (carried_kernels().flash_attention_4.empty() ? "cudnn" : "flash-attention-4") +
                " (auto), GEMMs cublaslt, head loss quack-lce" +
                (carried_kernels().flash_attention_4.empty()
                     ? " (this build lacks FlashAttention-4's backward for d64_g8, which auto would take here: "
                       "MXTRAIN_WITH_FA4=1 ./scripts/setup.sh builds them)"
                     : ""));
  // On a Hopper GPU, a fallback that only the build forced is named with the way to build it.
  const CarriedKernels carried = carried_kernels();
  const std::string gpt2_line = kernels_startup_line(load({{"model.preset", "gpt2-124m"}}), 90);
  const bool fa4 = std::find(carried.flash_attention_4.begin(), carried.flash_attention_4.end(), "d64_g1") !=
                   carried.flash_attention_4.end();
  EXPECT_EQ(gpt2_line.find("FlashAttention-4's backward for d64_g1") != std::string::npos, !fa4) << gpt2_line;
  EXPECT_EQ(gpt2_line.find("quack's GELU GEMMs") != std::string::npos, !carried.quack_gelu_gemms) << gpt2_line;
  EXPECT_EQ(gpt2_line.find("MXTRAIN_WITH_FA4=1 ./scripts/setup.sh") != std::string::npos,
            !fa4 || !carried.quack_gelu_gemms)
      << gpt2_line;
  // Not where auto would not take them anyway (a deterministic run, an fp32 run, another GPU) or
  // where the setting is explicit.
  for (const RunConfig& config : {load({{"model.preset", "gpt2-124m"}, {"train.deterministic", "true"}}),
                                  load({{"model.preset", "gpt2-124m"}, {"train.precision", "fp32"},
                                        {"train.gemm_kernels", "cublaslt"}}),
                                  load({{"model.preset", "gpt2-124m"}, {"train.attention_backward", "cudnn"},
                                        {"train.gemm_kernels", "cublaslt"}})})
    EXPECT_EQ(kernels_startup_line(config, 90).find("this build lacks"), std::string::npos)
        << kernels_startup_line(config, 90);
  EXPECT_EQ(kernels_startup_line(load({{"model.preset", "gpt2-124m"}}), 100).find("this build lacks"), std::string::npos);
}

// train.head_loss: auto is the chunked loss everywhere (quack's linear cross-entropy measured no
// faster in the step on an H100: docs/gemm-kernels.md); an explicit value stays.
TEST(KernelChoice, AutoHeadLossIsChunked) {
  for (int capability : {0, 90, 100})
    for (const char* model : {"gpt2-124m", "llama-3b"}) EXPECT_EQ(head_loss_of(load({{"model.preset", model}}), capability), "chunked");
  EXPECT_EQ(head_loss_of(load({{"model.preset", "gpt2-124m"}, {"train.head_loss", "quack-lce"}}), 0), "quack-lce");
  EXPECT_EQ(head_loss_of(load({{"model.preset", "gpt2-124m"}, {"train.head_loss", "chunked"}}), 90), "chunked");
}

// The planner plans auto as what this binary would take on the GPU planned for: on an H200 the
// same plan as the resolved values set explicitly, on a B200 the same as cuDNN's and cuBLASLt's.
TEST(KernelChoice, PlannerPlansAutoAsTheRunWouldTakeIt) {
  auto plan = [](const std::string& gpu, const std::string& settings) {
    std::string output;
    EXPECT_EQ(test::run_command(test::binary_path() + " plan -m llama-1b -b 8 -s 2048 -p bf16 --gpu " + gpu +
                                    " --json" + settings + " 2>/dev/null",
                                &output),
              0)
        << output;
    return nlohmann::json::parse(output);
  };
  const RunConfig config = load({{"model.preset", "llama-1b"}, {"train.seq_len", "2048"}, {"train.precision", "bf16"}});
  const std::string resolved = " --set train.attention_backward=" + attention_backward_of(config, 90) +
                               " --set train.gemm_kernels=" + gemm_kernels_of(config, 90);
  for (const auto& [gpu, settings] : std::vector<std::pair<std::string, std::string>>{
           {"h200", resolved}, {"b200", " --set train.attention_backward=cudnn --set train.gemm_kernels=cublaslt"}}) {
    const nlohmann::json automatic = plan(gpu, ""), pinned = plan(gpu, settings);
    EXPECT_EQ(automatic["memory"]["peak_live_bytes"], pinned["memory"]["peak_live_bytes"]) << gpu;
    EXPECT_EQ(automatic["time"]["step_s"], pinned["time"]["step_s"]) << gpu;
  }
}

TEST(KernelChoice, CpuRunTakesTheDefaults) {
  std::string output;
  test::TempDir dir;
  EXPECT_EQ(test::run_command(test::binary_path() + " train -d cpu -m tiny -b 2 -s 160 --steps 1 -o " + dir.file("run") +
                                  " 2>&1",
                              &output),
            0)
      << output;
  EXPECT_EQ(output.find("is a cuda setting"), std::string::npos) << output;
}

}  // namespace
}  // namespace mxtrain
