// cuDNN flash attention against the cpu oracle: causal GQA (8 heads on 2 KV heads) and plain
// multi-head (8/8), head dims 64 and 128, sequences 256 and 1024, forward (out, lse) and
// backward (dq, dk, dv packed in dqkv). The deterministic backward must reproduce its bits on
// a second run. Shapes cuDNN cannot run are Error(unsupported) naming the rule.
//
// Tolerances (relative L2; inputs identical, pre-rounded to bf16):
//   out, dqkv  2e-2  flash attention rounds the probabilities P (and dP's products) to bf16
//                    before the second GEMM of each pass, then rounds the output once
//   lse        1e-4  f32 statistics of exact bf16 products; only exp/log ulps and sum order
#include <cstring>

#include "cuda/cuda_test_support.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain::test {
namespace {

class CudaAttention : public CudaTest, public ::testing::WithParamInterface<AttentionCase> {};

TEST_P(CudaAttention, ForwardAndBackwardMatchOracle) {
  const AttentionCase& c = GetParam();
  const AttentionShape shape = shape_of(c);
  const int64_t rows = c.batch * c.seq;
  const Shape qkv_shape{rows, shape.qkv_cols()}, out_shape{rows, c.heads * c.head_dim};
  const Shape lse_shape{c.batch, c.heads, c.seq};
  const std::vector<float> qkv = random_as(static_cast<size_t>(qkv_shape.numel()), 90, DType::bf16, -2, 2);
  const std::vector<float> dout = random_as(static_cast<size_t>(out_shape.numel()), 91, DType::bf16);
  const std::string tag = case_name(c);

  Buffer cpu_qkv = upload(cpu(), qkv, qkv_shape);
  Buffer cpu_out = cpu().allocate("out", out_shape, DType::f32, Lifetime::scratch);
  Buffer cpu_lse = cpu().allocate("lse", lse_shape, DType::f32, Lifetime::scratch);
  cpu().attention_forward(cpu_qkv, cpu_out, cpu_lse, shape);
  Buffer gpu_qkv = upload(cuda(), qkv, qkv_shape, DType::bf16);
  Buffer gpu_out = cuda().allocate("out", out_shape, DType::bf16, Lifetime::scratch);
  Buffer gpu_lse = cuda().allocate("lse", lse_shape, DType::f32, Lifetime::scratch);
  cuda().attention_forward(gpu_qkv, gpu_out, gpu_lse, shape);
  EXPECT_LE(report_error("attention_forward out " + tag, download(cuda(), gpu_out), download(cpu(), cpu_out)), 2e-2);
  EXPECT_LE(report_error("attention_forward lse " + tag, download(cuda(), gpu_lse), download(cpu(), cpu_lse)), 1e-4);

  // Backward from the same forward state on both (the CPU's out and lse, rounded for the GPU).
  const std::vector<float> out_values = rounded(download(cpu(), cpu_out), DType::bf16);
  Buffer cpu_out_rounded = upload(cpu(), out_values, out_shape);
  Buffer gpu_out_rounded = upload(cuda(), out_values, out_shape, DType::bf16);
  Buffer gpu_lse_cpu = upload(cuda(), download(cpu(), cpu_lse), lse_shape);
  Buffer cpu_dout = upload(cpu(), dout, out_shape);
  Buffer gpu_dout = upload(cuda(), dout, out_shape, DType::bf16);
  Buffer cpu_dqkv = cpu().allocate("dqkv", qkv_shape, DType::f32, Lifetime::scratch);
  Buffer gpu_dqkv = cuda().allocate("dqkv", qkv_shape, DType::bf16, Lifetime::scratch);
  cuda().fill(gpu_dqkv, NAN);  // every element must be written
  cpu().attention_backward(cpu_dout, cpu_qkv, cpu_out_rounded, cpu_lse, cpu_dqkv, shape);
  cuda().attention_backward(gpu_dout, gpu_qkv, gpu_out_rounded, gpu_lse_cpu, gpu_dqkv, shape);
  const std::vector<float> got = download(cuda(), gpu_dqkv), want = download(cpu(), cpu_dqkv);
  // Per part, so a wrong stride in one of dq, dk, dv shows by name.
  const int64_t q_cols = c.heads * c.head_dim, kv_cols = c.kv_heads * c.head_dim;
  const char* names[3] = {"dq", "dk", "dv"};
  const int64_t begins[3] = {0, q_cols, q_cols + kv_cols}, widths[3] = {q_cols, kv_cols, kv_cols};
  for (int part = 0; part < 3; ++part) {
    std::vector<float> g, w;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t col = begins[part]; col < begins[part] + widths[part]; ++col) {
        g.push_back(got[static_cast<size_t>(r * qkv_shape[1] + col)]);
        w.push_back(want[static_cast<size_t>(r * qkv_shape[1] + col)]);
      }
    EXPECT_LE(report_error(std::string("attention_backward ") + names[part] + " " + tag, g, w), 2e-2);
  }

  // Deterministic backward: a second run gives the same bits.
  Buffer again = cuda().allocate("dqkv_again", qkv_shape, DType::bf16, Lifetime::scratch);
  cuda().attention_backward(gpu_dout, gpu_qkv, gpu_out_rounded, gpu_lse_cpu, again, shape);
  std::vector<uint16_t> first(static_cast<size_t>(qkv_shape.numel())), second(first.size());
  cuda().copy_to_host(gpu_dqkv, first.data());
  cuda().copy_to_host(again, second.data());
  EXPECT_EQ(0, std::memcmp(first.data(), second.data(), first.size() * sizeof(uint16_t)))
      << "deterministic attention backward differs between runs for " << tag;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention,
                         ::testing::Values(AttentionCase{2, 256, 8, 2, 64}, AttentionCase{2, 256, 8, 8, 64},
                                           AttentionCase{2, 256, 8, 2, 128}, AttentionCase{2, 256, 8, 8, 128},
                                           AttentionCase{1, 1024, 8, 2, 64}, AttentionCase{1, 1024, 8, 8, 64},
                                           AttentionCase{1, 1024, 8, 2, 128}, AttentionCase{1, 1024, 8, 8, 128}),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) { return case_name(info.param); });

class CudaAttentionModes : public CudaTest {};

TEST_F(CudaAttentionModes, F32ActivationsRunThroughBf16) {
  const AttentionCase c{2, 128, 4, 2, 64};
  const AttentionShape shape = shape_of(c);
  const Shape qkv_shape{c.batch * c.seq, shape.qkv_cols()}, out_shape{c.batch * c.seq, c.heads * c.head_dim};
  const std::vector<float> qkv = random_vector(static_cast<size_t>(qkv_shape.numel()), 92, -2, 2);
  Buffer cq = upload(cpu(), qkv, qkv_shape), gq = upload(cuda(), qkv, qkv_shape);
  Buffer co = cpu().allocate("o", out_shape, DType::f32, Lifetime::scratch);
  Buffer go = cuda().allocate("o", out_shape, DType::f32, Lifetime::scratch);
  Buffer cl = cpu().allocate("l", Shape{c.batch, c.heads, c.seq}, DType::f32, Lifetime::scratch);
  Buffer gl = cuda().allocate("l", Shape{c.batch, c.heads, c.seq}, DType::f32, Lifetime::scratch);
  cpu().attention_forward(cq, co, cl, shape);
  cuda().attention_forward(gq, go, gl, shape);
  // q, k, v are rounded to bf16 on the GPU side only: a few times the bf16 unit more.
  EXPECT_LE(report_error("attention_forward f32 out", download(cuda(), go), download(cpu(), co)), 2e-2);
  EXPECT_LE(report_error("attention_forward f32 lse", download(cuda(), gl), download(cpu(), cl)), 2e-3);
}

TEST_F(CudaAttentionModes, NonDeterministicBackwardAlsoRuns) {
  cuda_backend().set_deterministic_attention(false);
  const AttentionCase c{2, 256, 8, 2, 64};
  const AttentionShape shape = shape_of(c);
  const Shape qkv_shape{c.batch * c.seq, shape.qkv_cols()}, out_shape{c.batch * c.seq, c.heads * c.head_dim};
  Buffer qkv = upload(cuda(), random_vector(static_cast<size_t>(qkv_shape.numel()), 93), qkv_shape, DType::bf16);
  Buffer out = cuda().allocate("o", out_shape, DType::bf16, Lifetime::scratch);
  Buffer lse = cuda().allocate("l", Shape{c.batch, c.heads, c.seq}, DType::f32, Lifetime::scratch);
  Buffer dout = upload(cuda(), random_vector(static_cast<size_t>(out_shape.numel()), 94), out_shape, DType::bf16);
  Buffer dqkv = cuda().allocate("dqkv", qkv_shape, DType::bf16, Lifetime::scratch);
  cuda().attention_forward(qkv, out, lse, shape);
  cuda().attention_backward(dout, qkv, out, lse, dqkv, shape);
  const std::vector<float> grads = download(cuda(), dqkv);
  for (float g : grads) ASSERT_TRUE(std::isfinite(g));
  std::printf("[ info  ] cuDNN workspace after both modes: %zu bytes\n", cuda_backend().attention_workspace_bytes());
}

TEST_F(CudaAttentionModes, UnsupportedHeadDimIsAnError) {
  AttentionShape shape = shape_of({1, 64, 2, 2, 20});
  Buffer qkv = cuda().allocate("qkv", Shape{64, shape.qkv_cols()}, DType::bf16, Lifetime::scratch);
  Buffer out = cuda().allocate("o", Shape{64, 40}, DType::bf16, Lifetime::scratch);
  Buffer lse = cuda().allocate("l", Shape{1, 2, 64}, DType::f32, Lifetime::scratch);
  try {
    cuda().attention_forward(qkv, out, lse, shape);
    FAIL() << "head_dim 20 should be rejected";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::unsupported);
    EXPECT_NE(std::string(error.what()).find("head_dim=20"), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find("multiple of 8"), std::string::npos) << error.what();
  }
}

}  // namespace
}  // namespace mxtrain::test
