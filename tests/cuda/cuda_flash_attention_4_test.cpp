// FlashAttention-4's attention backward (train.attention_backward = flash-attention-4) against
// cuDNN's, from the same cuDNN forward (O and statistics), at head dimensions 64 (1, 2, 4 and 8
// query heads per KV head) and 128 (1, 3 and 4), sequences that are and are not whole tiles
// (configurations a default scripts/fa4_kernels.sh export carries); against the CPU oracle;
// every element written; its workspace the planner's formula; shapes it cannot run are errors
// naming the fix; and 200 training steps of the tiny preset follow cuDNN's loss curve.
// Without the kernels in the build, the setting is refused with the way to build them, and the
// rest is skipped (the device runs build with them: tests/cuda/run_on_device.sh).
//
// Tolerances (relative L2): against cuDNN's backward 1e-2 (both round P and dS to bf16 before
// their GEMMs, in other orders; measured 7e-5..4e-3 at the benchmark shapes); against the CPU
// oracle 2e-2, as cuDNN's own test.
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "cuda/cuda_test_support.hpp"
#include "mxtrain/backend/cuda/flash_attention_4.hpp"
#include "mxtrain/backend/private_buffers.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/train/trainer.hpp"

namespace mxtrain::test {
namespace {

bool built_with_kernels() { return !flash_attention_4::carried().empty(); }

class CudaFlashAttention4 : public CudaTest {
 protected:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped()) return;
    cuda_backend().set_deterministic_attention(false);
  }
};

TEST_F(CudaFlashAttention4, SettingFollowsTheBuild) {
  std::string carried;
  for (const std::string& tag : flash_attention_4::carried()) carried += " " + tag;
  std::printf("[ info  ] FlashAttention-4 configurations in this build:%s\n", carried.empty() ? " none" : carried.c_str());
  if (built_with_kernels()) {
    cuda_backend().set_flash_attention_4_backward(true);
    EXPECT_TRUE(cuda_backend().flash_attention_4_backward());
    return;
  }
  try {
    cuda_backend().set_flash_attention_4_backward(true);
    FAIL() << "a build without the kernels accepted train.attention_backward = flash-attention-4";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::config);
    EXPECT_NE(error.full_message().find("scripts/fa4_kernels.sh"), std::string::npos) << error.full_message();
  }
}

class CudaFlashAttention4Shapes : public CudaFlashAttention4, public ::testing::WithParamInterface<AttentionCase> {};

TEST_P(CudaFlashAttention4Shapes, MatchesCudnnBackwardAndTheOracle) {
  if (!built_with_kernels()) GTEST_SKIP() << "built without FlashAttention-4's kernels";
  const AttentionCase& c = GetParam();
  const AttentionShape shape = shape_of(c);
  const int64_t rows = c.batch * c.seq;
  const Shape qkv_shape{rows, shape.qkv_cols()}, out_shape{rows, c.heads * c.head_dim};
  const Shape lse_shape{c.batch, c.heads, c.seq};
  const std::string tag = case_name(c);
  const std::vector<float> qkv = random_as(static_cast<size_t>(qkv_shape.numel()), 95, DType::bf16, -2, 2);
  const std::vector<float> dout = random_as(static_cast<size_t>(out_shape.numel()), 96, DType::bf16);
  Buffer gpu_qkv = upload(cuda(), qkv, qkv_shape, DType::bf16);
  Buffer gpu_dout = upload(cuda(), dout, out_shape, DType::bf16);
  Buffer gpu_out = cuda().allocate("out", out_shape, DType::bf16, Lifetime::scratch);
  Buffer gpu_lse = cuda().allocate("lse", lse_shape, DType::f32, Lifetime::scratch);
  cuda().attention_forward(gpu_qkv, gpu_out, gpu_lse, shape);

  Buffer by_cudnn = cuda().allocate("dqkv_cudnn", qkv_shape, DType::bf16, Lifetime::scratch);
  cuda().attention_backward(gpu_dout, gpu_qkv, gpu_out, gpu_lse, by_cudnn, shape);
  cuda_backend().set_flash_attention_4_backward(true);
  Buffer by_fa4 = cuda().allocate("dqkv_fa4", qkv_shape, DType::bf16, Lifetime::scratch);
  cuda().fill(by_fa4, NAN);  // every element must be written
  cuda().attention_backward(gpu_dout, gpu_qkv, gpu_out, gpu_lse, by_fa4, shape);
  EXPECT_GE(cuda_backend().attention_workspace_bytes(),
            static_cast<size_t>(private_buffers::flash_attention_4_workspace(shape).bytes()));

  // The oracle from the same O (cuDNN's, widened) and statistics.
  Buffer cpu_qkv = upload(cpu(), qkv, qkv_shape);
  Buffer cpu_out = upload(cpu(), download(cuda(), gpu_out), out_shape);
  Buffer cpu_lse = upload(cpu(), download(cuda(), gpu_lse), lse_shape);
  Buffer cpu_dout = upload(cpu(), dout, out_shape);
  Buffer cpu_dqkv = cpu().allocate("dqkv", qkv_shape, DType::f32, Lifetime::scratch);
  cpu().attention_backward(cpu_dout, cpu_qkv, cpu_out, cpu_lse, cpu_dqkv, shape);

  const std::vector<float> fa4 = download(cuda(), by_fa4), cudnn = download(cuda(), by_cudnn),
                           oracle = download(cpu(), cpu_dqkv);
  size_t non_finite = 0;
  for (float g : fa4) non_finite += !std::isfinite(g);
  EXPECT_EQ(non_finite, 0u) << "elements of dqkv FlashAttention-4 left unwritten or non-finite, " << tag;
  const int64_t q_cols = c.heads * c.head_dim, kv_cols = c.kv_heads * c.head_dim;
  const char* names[3] = {"dq", "dk", "dv"};
  const int64_t begins[3] = {0, q_cols, q_cols + kv_cols}, widths[3] = {q_cols, kv_cols, kv_cols};
  for (int part = 0; part < 3; ++part) {
    std::vector<float> got, ref, want;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = begins[part]; col < begins[part] + widths[part]; ++col) {
        const size_t i = static_cast<size_t>(r * qkv_shape[1] + col);
        got.push_back(fa4[i]);
        ref.push_back(cudnn[i]);
        want.push_back(oracle[i]);
      }
    EXPECT_LE(report_error(std::string("fa4 backward vs cudnn ") + names[part] + " " + tag, got, ref), 1e-2);
    EXPECT_LE(report_error(std::string("fa4 backward vs oracle ") + names[part] + " " + tag, got, want), 2e-2);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaFlashAttention4Shapes,
                         ::testing::Values(AttentionCase{2, 256, 8, 2, 64}, AttentionCase{2, 320, 8, 2, 64},
                                           AttentionCase{2, 384, 4, 4, 64}, AttentionCase{1, 200, 4, 2, 64},
                                           AttentionCase{1, 512, 16, 2, 64}, AttentionCase{1, 512, 6, 2, 128},
                                           AttentionCase{1, 328, 6, 2, 128}, AttentionCase{2, 256, 8, 2, 128},
                                           AttentionCase{1, 384, 4, 4, 128}),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return case_name(info.param); });

void expect_refused(CudaBackend& backend, const AttentionCase& c, const std::string& words) {
  try {
    backend.check_attention_backward(shape_of(c), DType::bf16);
    ADD_FAILURE() << case_name(c) << " should be refused";
  } catch (const Error& error) {
    EXPECT_NE(error.full_message().find(words), std::string::npos) << error.full_message();
    EXPECT_NE(error.advice().find("train.attention_backward = cudnn"), std::string::npos) << error.full_message();
  }
}

TEST_F(CudaFlashAttention4, ShapesItCannotRunAreErrors) {
  if (!built_with_kernels()) GTEST_SKIP() << "built without FlashAttention-4's kernels";
  cuda_backend().set_flash_attention_4_backward(true);
  expect_refused(cuda_backend(), {2, 128, 8, 2, 64}, "more than 128");
  expect_refused(cuda_backend(), {2, 256, 12, 2, 64}, "d64_g6");  // not exported by default
  expect_refused(cuda_backend(), {2, 256, 8, 2, 256}, "8..128");
  cuda_backend().check_attention_backward(shape_of({2, 256, 8, 2, 64}), DType::bf16);  // carried: no error
  cuda_backend().set_deterministic_attention(true);
  try {
    cuda_backend().check_attention_backward(shape_of({2, 256, 8, 2, 64}), DType::bf16);
    FAIL() << "deterministic with FlashAttention-4 should be refused";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::config);
  }
}

std::vector<double> losses(const std::string& run_dir) {
  std::vector<double> values;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) values.push_back(record["loss"].get<double>());
  }
  return values;
}

TEST(CudaFlashAttention4Training, TinyPresetFollowsCudnnCurve) {
  if (!backend_available("cuda")) GTEST_SKIP() << "no CUDA device";
  if (!built_with_kernels()) GTEST_SKIP() << "built without FlashAttention-4's kernels";
  const std::string corpus = source_dir() + "/data/fortunes";
  ASSERT_TRUE(std::filesystem::exists(corpus + "/train_000000.bin"))
      << "the corpus is missing: run scripts/setup.sh (or mxtrain prepare) first";
  TempDir dir;
  auto run = [&](const std::string& backward) {
    ConfigSources sources;
    sources.read_environment = false;
    sources.overrides = {{"model.preset", "tiny"},       {"train.device", "cuda"},
                         {"train.precision", "bf16"},    {"train.steps", "200"},
                         {"train.micro_batch_size", "8"}, {"train.seq_len", "256"},
                         {"train.attention_backward", backward}, {"eval.every", "0"},
                         {"eval.batches", "4"},          {"checkpoint.every", "0"},
                         {"checkpoint.dir", dir.file(backward)}, {"log.every", "50"},
                         {"data.train", corpus + "/train_*.bin"}, {"data.val", corpus + "/val_*.bin"}};
    const TrainerSummary summary = Trainer(load_config(sources), {}).run();
    return std::make_pair(summary.final_val_loss, losses(dir.file(backward)));
  };
  const auto [cudnn_val, cudnn_curve] = run("cudnn");
  const auto [fa4_val, fa4_curve] = run("flash-attention-4");
  ASSERT_EQ(cudnn_curve.size(), 200u);
  ASSERT_EQ(fa4_curve.size(), 200u);
  auto tail = [](const std::vector<double>& v) {
    double sum = 0;
    for (size_t i = v.size() - 20; i < v.size(); ++i) sum += v[i];
    return sum / 20;
  };
  std::printf("[ info  ] tiny preset, 200 steps: loss curve end cudnn %.4f, flash-attention-4 %.4f; held-out %.4f vs %.4f\n",
              tail(cudnn_curve), tail(fa4_curve), cudnn_val, fa4_val);
  // Step 1 runs the same forward on the same weights (GEMM autotuning may pick other algorithms).
  EXPECT_NEAR(fa4_curve.front(), cudnn_curve.front(), 1e-3 * cudnn_curve.front());
  EXPECT_LT(std::fabs(tail(fa4_curve) - tail(cudnn_curve)), 0.01 * tail(cudnn_curve));
  EXPECT_LT(std::fabs(fa4_val - cudnn_val), 0.01 * cudnn_val);
  EXPECT_LT(tail(fa4_curve), 0.6 * fa4_curve.front()) << "the loss did not fall";
}

}  // namespace
}  // namespace mxtrain::test
