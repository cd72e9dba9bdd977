// Generation with a key/value cache on the GPU against the cpu oracle: RoPE at a position offset
// and attention_cached (a prefill, then single rows) in f32 and bf16, head dims 16, 64 and 128,
// GQA and multi-head; and a small llama model whose cached logits on the GPU equal its uncached
// ones (forward_logits over the whole prefix) for every prefix: in f32 those of the CPU oracle's
// model (the GPU's uncached f32 attention runs cuDNN in bf16, the cached one in f32), in bf16 the
// GPU's own.
//
// Tolerances (relative L2; inputs identical, pre-rounded to bf16 for bf16 runs):
//   f32   1e-5  the same math in another order (online softmax over 8 warps, fast exp)
//   bf16  1e-2  the output is rounded to bf16 once
//   model f32 1e-4 (against the CPU: TF32-free f32 GEMMs in another order), bf16 3e-2: every
//         block's activations are rounded in bf16 runs, and cuDNN's flash attention (the
//         uncached side) rounds its probabilities to bf16
#include "cuda/cuda_test_support.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/model/transformer.hpp"

namespace mxtrain::test {
namespace {

struct CachedCase {
  int64_t past_rows, heads, kv_heads, head_dim;
  DType dtype;
};

class CudaKvCache : public CudaTest, public ::testing::WithParamInterface<CachedCase> {};

TEST_P(CudaKvCache, RopeAndCachedAttentionMatchTheOracle) {
  const CachedCase& c = GetParam();
  const int64_t total = c.past_rows + 3;  // a prefill of past_rows, then 3 single rows
  AttentionShape whole;
  whole.batch = 1;
  whole.seq = total;
  whole.heads = c.heads;
  whole.kv_heads = c.kv_heads;
  whole.head_dim = c.head_dim;
  whole.softmax_scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const int64_t cols = whole.qkv_cols(), out_cols = c.heads * c.head_dim, kv_cols = c.kv_heads * c.head_dim;
  const std::vector<float> values = random_as(static_cast<size_t>(total * cols), 70, c.dtype, -2, 2);
  const double tolerance = c.dtype == DType::f32 ? 1e-5 : 1e-2;
  const std::string tag = "D" + std::to_string(c.head_dim) + "_H" + std::to_string(c.heads) + "_KV" +
                          std::to_string(c.kv_heads) + "_" + dtype_text(c.dtype);
  RopeSpec rope;
  rope.theta = 10000.0f;
  Buffer cpu_keys = cpu().allocate("k", Shape{total, kv_cols}, DType::f32, Lifetime::scratch);
  Buffer cpu_values = cpu().allocate("v", Shape{total, kv_cols}, DType::f32, Lifetime::scratch);
  Buffer gpu_keys = cuda().allocate("k", Shape{total, kv_cols}, c.dtype, Lifetime::scratch);
  Buffer gpu_values = cuda().allocate("v", Shape{total, kv_cols}, c.dtype, Lifetime::scratch);
  for (int64_t begin = 0; begin < total;) {
    const int64_t count = begin == 0 ? c.past_rows : 1;
    AttentionShape step = whole;
    step.seq = count;
    step.position_offset = begin;
    const std::vector<float> rows(values.begin() + begin * cols, values.begin() + (begin + count) * cols);
    Buffer cpu_qkv = upload(cpu(), rows, Shape{count, cols});
    Buffer gpu_qkv = upload(cuda(), rows, Shape{count, cols}, c.dtype);
    cpu().rope_forward(cpu_qkv, step, rope);
    cuda().rope_forward(gpu_qkv, step, rope);
    EXPECT_LE(report_error("rope at " + std::to_string(begin) + " " + tag, download(cuda(), gpu_qkv),
                           download(cpu(), cpu_qkv)),
              c.dtype == DType::f32 ? 1e-6 : 1e-2);
    // Both sides attend from the same (GPU-rotated) inputs.
    Buffer same_qkv = upload(cpu(), download(cuda(), gpu_qkv), Shape{count, cols});
    Buffer cpu_out = cpu().allocate("out", Shape{count, out_cols}, DType::f32, Lifetime::scratch);
    Buffer gpu_out = cuda().allocate("out", Shape{count, out_cols}, c.dtype, Lifetime::scratch);
    cpu().attention_cached(same_qkv, cpu_keys, cpu_values, cpu_out, step);
    cuda().attention_cached(gpu_qkv, gpu_keys, gpu_values, gpu_out, step);
    EXPECT_LE(report_error("attention_cached at " + std::to_string(begin) + " " + tag, download(cuda(), gpu_out),
                           download(cpu(), cpu_out)),
              tolerance);
    begin += count;
  }
  EXPECT_EQ(download(cuda(), gpu_keys), download(cpu(), cpu_keys)) << tag;
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaKvCache,
                         ::testing::Values(CachedCase{300, 8, 2, 64, DType::f32}, CachedCase{300, 8, 2, 64, DType::bf16},
                                           CachedCase{77, 4, 4, 128, DType::bf16}, CachedCase{5, 4, 1, 16, DType::f32},
                                           CachedCase{1100, 16, 8, 128, DType::bf16}),
                         [](const ::testing::TestParamInfo<CachedCase>& info) {
                           const CachedCase& c = info.param;
                           return "past" + std::to_string(c.past_rows) + "_H" + std::to_string(c.heads) + "_KV" +
                                  std::to_string(c.kv_heads) + "_D" + std::to_string(c.head_dim) + "_" +
                                  dtype_text(c.dtype);
                         });

class CudaKvCacheModel : public CudaTest, public ::testing::WithParamInterface<DType> {};

TEST_P(CudaKvCacheModel, CachedLogitsEqualTheUncachedOnes) {
  const DType dtype = GetParam();
  ModelConfig config = model_preset("tiny");
  config.hidden = 256;
  config.heads = 4;
  config.kv_heads = 2;
  config.layers = 2;
  config.ffn_hidden = 512;
  config.max_seq_len = 64;
  LocalParameterStore store(cuda(), config, dtype, dtype);
  store.initialize(3);
  TransformerOptions options;
  options.activation_dtype = dtype;
  Transformer model(config, options, cuda(), store);
  // The uncached side: the CPU oracle's model (f32; the same initial values) or the GPU's own.
  const bool on_cpu = dtype == DType::f32;
  Backend& reference_backend = on_cpu ? cpu() : cuda();
  LocalParameterStore cpu_store(cpu(), config, DType::f32, DType::f32);
  cpu_store.initialize(3);
  Transformer cpu_model(config, TransformerOptions{}, cpu(), cpu_store);
  Transformer& reference = on_cpu ? cpu_model : model;
  std::vector<int32_t> tokens(40);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % config.vocab_size);
  KvCache cache = model.make_kv_cache(48);
  Buffer cached = cuda().allocate("cached", Shape{1, config.padded_vocab}, dtype, Lifetime::scratch);
  Buffer whole = reference_backend.allocate("whole", Shape{1, config.padded_vocab}, dtype, Lifetime::scratch);
  const int64_t prefill = 24;
  Buffer first = upload_i32(cuda(), std::vector<int32_t>(tokens.begin(), tokens.begin() + prefill), Shape{prefill});
  model.forward_cached(first, cache, cached);
  for (int64_t length = prefill;; ++length) {
    Buffer prefix =
        upload_i32(reference_backend, std::vector<int32_t>(tokens.begin(), tokens.begin() + length), Shape{length});
    reference.forward_logits(prefix, 1, length, length - 1, whole);
    EXPECT_LE(report_error("cached logits at " + std::to_string(length) + " " + dtype_text(dtype),
                           download(cuda(), cached), download(reference_backend, whole)),
              dtype == DType::f32 ? 1e-4 : 3e-2);
    if (length == static_cast<int64_t>(tokens.size())) break;
    Buffer next = upload_i32(cuda(), {tokens[static_cast<size_t>(length)]}, Shape{1});
    model.forward_cached(next, cache, cached);
  }
}

INSTANTIATE_TEST_SUITE_P(Dtypes, CudaKvCacheModel, ::testing::Values(DType::f32, DType::bf16),
                         [](const ::testing::TestParamInfo<DType>& info) { return dtype_text(info.param); });

}  // namespace
}  // namespace mxtrain::test
