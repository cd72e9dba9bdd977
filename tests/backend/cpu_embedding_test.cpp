// Token and position embeddings on the cpu backend: forward against a scalar gather, backward
// (+= into both tables, repeated tokens) against finite differences of Σ out·R, and an
// out-of-range token id reported as an internal error.
#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

struct EmbeddingCase {
  const char* name;
  int64_t batch, seq, vocab, hidden;
  bool with_positions;
};

const EmbeddingCase kEmbeddingCases[] = {
    {"tokens_only_batch2", 2, 5, 7, 6, false},
    {"with_positions_batch3", 3, 4, 5, 70, true},  // 70 columns: two column blocks in the backward
    {"one_sequence_positions", 1, 9, 4, 3, true},
};

class CpuEmbedding : public testing::TestWithParam<EmbeddingCase> {
 protected:
  void SetUp() override {
    const EmbeddingCase& c = GetParam();
    // Few distinct ids, so tokens repeat within and across sequences.
    for (int64_t i = 0; i < c.batch * c.seq; ++i) tokens_.push_back(static_cast<int32_t>((i * 3 + i / 2) % c.vocab));
    table_ = random_vector(static_cast<size_t>(c.vocab * c.hidden), 81);
    if (c.with_positions) positions_ = random_vector(static_cast<size_t>(c.seq * c.hidden), 82);
  }
  int64_t rows() const { return GetParam().batch * GetParam().seq; }

  std::vector<float> forward(const std::vector<float>& table, const std::vector<float>& positions) {
    const EmbeddingCase& c = GetParam();
    Buffer tokens = upload_i32(backend_, tokens_, Shape{c.batch, c.seq});
    Buffer ttable = upload(backend_, table, Shape{c.vocab, c.hidden});
    Buffer tpositions = c.with_positions ? upload(backend_, positions, Shape{c.seq, c.hidden}) : Buffer();
    Buffer out = zeros(backend_, Shape{rows(), c.hidden});
    backend_.embedding_forward(tokens, ttable, tpositions, out, c.seq);
    return download(backend_, out);
  }

  CpuBackend backend_{2};
  std::vector<int32_t> tokens_;
  std::vector<float> table_, positions_;
};

TEST_P(CpuEmbedding, ForwardGathersRows) {
  const EmbeddingCase& c = GetParam();
  std::vector<float> expected(static_cast<size_t>(rows() * c.hidden));
  for (int64_t i = 0; i < rows(); ++i) {
    for (int64_t h = 0; h < c.hidden; ++h) {
      float value = table_[static_cast<size_t>(tokens_[static_cast<size_t>(i)] * c.hidden + h)];
      if (c.with_positions) value += positions_[static_cast<size_t>((i % c.seq) * c.hidden + h)];
      expected[static_cast<size_t>(i * c.hidden + h)] = value;
    }
  }
  EXPECT_TRUE(same_bits(forward(table_, positions_), expected));  // one f32 add at most: exact
}

TEST_P(CpuEmbedding, BackwardMatchesFiniteDifferences) {
  const EmbeddingCase& c = GetParam();
  const std::vector<float> r = random_vector(static_cast<size_t>(rows() * c.hidden), 83);
  const std::vector<float> dtable_before = random_vector(table_.size(), 84);
  const std::vector<float> dpositions_before = random_vector(positions_.size(), 85);
  Buffer tokens = upload_i32(backend_, tokens_, Shape{c.batch, c.seq});
  Buffer dout = upload(backend_, r, Shape{rows(), c.hidden});
  Buffer dtable = upload(backend_, dtable_before, Shape{c.vocab, c.hidden});
  Buffer dpositions = c.with_positions ? upload(backend_, dpositions_before, Shape{c.seq, c.hidden}) : Buffer();
  backend_.embedding_backward(tokens, dout, dtable, dpositions, c.seq);

  const std::vector<float> dtable_numeric =
      numeric_gradient(table_, [&](const std::vector<float>& v) { return weighted_sum(forward(v, positions_), r); });
  EXPECT_LE(relative_l2_error(difference(download(backend_, dtable), dtable_before), dtable_numeric),
            kGradientTolerance);
  if (c.with_positions) {
    const std::vector<float> dpositions_numeric =
        numeric_gradient(positions_, [&](const std::vector<float>& v) { return weighted_sum(forward(table_, v), r); });
    EXPECT_LE(relative_l2_error(difference(download(backend_, dpositions), dpositions_before), dpositions_numeric),
              kGradientTolerance);
  }
}

INSTANTIATE_TEST_SUITE_P(, CpuEmbedding, testing::ValuesIn(kEmbeddingCases), CaseName());

TEST(CpuEmbeddingTokens, TokenOutsideTableIsAnInternalError) {
  CpuBackend backend(2);
  Buffer tokens = upload_i32(backend, {0, 4}, Shape{2});
  Buffer table = zeros(backend, Shape{4, 3});
  Buffer out = zeros(backend, Shape{2, 3});
  try {
    backend.embedding_forward(tokens, table, Tensor(), out, 2);
    FAIL() << "no error for token 4 of a 4-row table";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::internal);
  }
}

}  // namespace
}  // namespace mxtrain::test
