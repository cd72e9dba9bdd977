// Determinism of the cpu backend: every op that reduces across rows, threads or heads gives the
// same bits with 1, 2 and 3 threads, and the same bits again when rerun (the model's recompute
// relies on both). Shapes are chosen so the fixed reduction chunks, column blocks, GEMM tiles and
// attention tasks are shared out differently for each thread count.
#include <functional>

#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

using Outputs = std::vector<std::vector<float>>;

struct DeterminismCase {
  const char* name;
  std::function<Outputs(Backend&)> run;
};

Outputs norm_backward(Backend& backend, NormKind kind) {
  const int64_t rows = 203, cols = 48;  // 7 chunks of 32 rows, the last one short
  Buffer x = upload(backend, random_vector(rows * cols, 301, -1.0f, 2.0f), Shape{rows, cols});
  Buffer weight = upload(backend, random_vector(cols, 302), Shape{cols});
  Buffer bias = upload(backend, random_vector(cols, 303), Shape{cols});
  Buffer out = zeros(backend, Shape{rows, cols}), mean = zeros(backend, Shape{rows}), rstd = zeros(backend, Shape{rows});
  backend.norm_forward(kind, x, weight, bias, out, mean, rstd, 1e-5f);
  Buffer dout = upload(backend, random_vector(rows * cols, 304), Shape{rows, cols});
  Buffer dx = upload(backend, random_vector(rows * cols, 305), Shape{rows, cols});
  Buffer dweight = upload(backend, random_vector(cols, 306), Shape{cols});
  Buffer dbias = upload(backend, random_vector(cols, 307), Shape{cols});
  backend.norm_backward(kind, dout, x, weight, mean, rstd, dx, dweight, dbias, true);
  return {download(backend, out), download(backend, rstd), download(backend, dx), download(backend, dweight),
          download(backend, dbias)};
}

Outputs linear(Backend& backend) {
  const int64_t rows = 300, in_features = 256, out_features = 600;  // 3 x 2 GEMM tiles of 128 x 512
  Buffer x = upload(backend, random_vector(rows * in_features, 311), Shape{rows, in_features});
  Buffer weight = upload(backend, random_vector(out_features * in_features, 312), Shape{out_features, in_features});
  Buffer bias = upload(backend, random_vector(out_features, 313), Shape{out_features});
  Buffer out = zeros(backend, Shape{rows, out_features});
  backend.gemm({.role = GemmRole::forward, .a = x, .b = weight, .out = out, .bias = bias});
  Buffer dx = zeros(backend, Shape{rows, in_features});
  backend.gemm({.role = GemmRole::backward_input, .a = out, .b = weight, .out = dx});
  Buffer dweight = upload(backend, random_vector(out_features * in_features, 314), Shape{out_features, in_features});
  Buffer dbias = upload(backend, random_vector(out_features, 315), Shape{out_features});
  backend.gemm({.role = GemmRole::backward_weight, .a = out, .b = x, .out = dweight, .accumulate = true,
                .bias_gradient = dbias});
  return {download(backend, out), download(backend, dx), download(backend, dweight), download(backend, dbias)};
}

Outputs embedding(Backend& backend) {
  const int64_t batch = 4, seq = 50, vocab = 9, hidden = 200;  // 9 ids over 200 rows: heavy repetition
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < batch * seq; ++i) ids.push_back(static_cast<int32_t>((i * i + 3 * i) % vocab));
  Buffer tokens = upload_i32(backend, ids, Shape{batch, seq});
  Buffer dout = upload(backend, random_vector(batch * seq * hidden, 321), Shape{batch * seq, hidden});
  Buffer dtable = upload(backend, random_vector(vocab * hidden, 322), Shape{vocab, hidden});
  Buffer dpositions = upload(backend, random_vector(seq * hidden, 323), Shape{seq, hidden});
  backend.embedding_backward(tokens, dout, dtable, dpositions, seq);
  return {download(backend, dtable), download(backend, dpositions)};
}

Outputs sums(Backend& backend) {
  const int64_t count = 100003;
  Buffer x = upload(backend, random_vector(count, 331, -1.0f, 1.5f), Shape{count});
  Buffer total = zeros(backend, Shape{1}), squares = zeros(backend, Shape{1});
  backend.sum(x, total, false);
  backend.sum_of_squares(x, squares, false);
  return {download(backend, total), download(backend, squares)};
}

Outputs attention(Backend& backend) {
  AttentionShape shape;
  shape.batch = 3;
  shape.seq = 33;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = 16;
  const int64_t rows = shape.batch * shape.seq, out_cols = shape.heads * shape.head_dim;
  Buffer qkv = upload(backend, random_vector(rows * shape.qkv_cols(), 341), Shape{rows, shape.qkv_cols()});
  backend.rope_forward(qkv, shape, 10000.0f);
  Buffer out = zeros(backend, Shape{rows, out_cols});
  Buffer lse = zeros(backend, Shape{shape.batch, shape.heads, shape.seq});
  backend.attention_forward(qkv, out, lse, shape);
  Buffer dout = upload(backend, random_vector(rows * out_cols, 342), Shape{rows, out_cols});
  Buffer dqkv = zeros(backend, Shape{rows, shape.qkv_cols()});
  backend.attention_backward(dout, qkv, out, lse, dqkv, shape);
  backend.rope_backward(dqkv, shape, 10000.0f);
  return {download(backend, out), download(backend, lse), download(backend, dqkv)};
}

Outputs cross_entropy_and_adamw(Backend& backend) {
  const int64_t rows = 64, vocab = 1000, count = 50000;
  Buffer logits = upload(backend, random_vector(rows * vocab, 351, -4.0f, 4.0f), Shape{rows, vocab});
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < rows; ++i) ids.push_back(static_cast<int32_t>(i * 13 % 997));
  Buffer targets = upload_i32(backend, ids, Shape{rows});
  Buffer losses = zeros(backend, Shape{rows});
  backend.cross_entropy(logits, targets, losses, 997, 0.5f);

  Buffer param = upload(backend, random_vector(count, 352), Shape{count});
  Buffer grad = upload(backend, random_vector(count, 353), Shape{count});
  Buffer m = zeros(backend, Shape{count}), v = zeros(backend, Shape{count}), norm_sq = zeros(backend, Shape{1});
  backend.sum_of_squares(grad, norm_sq, false);
  AdamWArgs args;
  args.learning_rate = 1e-3f;
  args.weight_decay = 0.1f;
  args.decay_count = count / 2;
  args.max_grad_norm = 1.0f;
  backend.adamw(param, grad, m, v, Tensor(), norm_sq, args);
  return {download(backend, losses), download(backend, logits), download(backend, param), download(backend, v)};
}

const DeterminismCase kDeterminismCases[] = {
    {"layer_norm", [](Backend& backend) { return norm_backward(backend, NormKind::layer); }},
    {"rms_norm", [](Backend& backend) { return norm_backward(backend, NormKind::rms); }},
    {"linear_openblas", linear},
    {"embedding_backward", embedding},
    {"sum_and_sum_of_squares", sums},
    {"rope_and_gqa_attention", attention},
    {"cross_entropy_and_adamw", cross_entropy_and_adamw},
};

class CpuDeterminism : public testing::TestWithParam<DeterminismCase> {};

TEST_P(CpuDeterminism, SameBitsForAnyThreadCountAndOnRerun) {
  CpuBackend one(1), two(2), three(3);
  const Outputs reference = GetParam().run(one);
  ASSERT_FALSE(reference.empty());
  const Outputs rerun = GetParam().run(one);
  const Outputs with_two = GetParam().run(two);
  const Outputs with_three = GetParam().run(three);
  for (size_t i = 0; i < reference.size(); ++i) {
    EXPECT_TRUE(same_bits(rerun[i], reference[i])) << "output " << i << " changed on rerun";
    EXPECT_TRUE(same_bits(with_two[i], reference[i])) << "output " << i << " differs with 2 threads";
    EXPECT_TRUE(same_bits(with_three[i], reference[i])) << "output " << i << " differs with 3 threads";
  }
}

INSTANTIATE_TEST_SUITE_P(, CpuDeterminism, testing::ValuesIn(kDeterminismCases), CaseName());

}  // namespace
}  // namespace mxtrain::test
