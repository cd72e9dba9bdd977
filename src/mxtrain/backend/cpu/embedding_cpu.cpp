// Token (and learned position) embeddings. Trick: the backward scatters rows into the tables,
// and a token id repeats within a batch, so it is parallelised over column ranges rather than
// rows: each thread owns whole columns and adds the rows into them in row order. No two threads
// ever touch the same table element, and every element's sum runs in the serial order, so the
// result is identical for any thread count. Token ids are validated before any parallel work.
#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"

namespace mxtrain {
namespace {

// Columns per parallel task in the backward: 64 floats = four cache lines per row.
constexpr int64_t kColumnBlock = 64;

void check_tokens(const char* op, const Tensor& tokens, int64_t vocab) {
  const int32_t* ids = tokens.ptr<int32_t>();
  for (int64_t i = 0; i < tokens.numel(); ++i) {
    MXTRAIN_ASSERT(ids[i] >= 0 && ids[i] < vocab, "%s: token %d at %lld outside the table's %lld rows", op, ids[i],
                   static_cast<long long>(i), static_cast<long long>(vocab));
  }
}

}  // namespace

void CpuBackend::impl_embedding_forward(const Tensor& tokens, const Tensor& token_table,
                                        const Tensor& position_table, const Tensor& out, int64_t seq_len) {
  cpu::require_f32("embedding_forward", {&token_table, &position_table, &out});
  check_tokens("embedding_forward", tokens, token_table.rows());
  MXTRAIN_ASSERT(!position_table.defined() || position_table.rows() >= seq_len,
                 "embedding_forward: %lld positions for seq_len %lld", static_cast<long long>(position_table.rows()),
                 static_cast<long long>(seq_len));
  const int64_t cols = out.cols();
  const int32_t* ids = tokens.ptr<int32_t>();
  const float* table = token_table.ptr<float>();
  const float* positions = position_table.defined() ? position_table.ptr<float>() : nullptr;
  float* result = out.ptr<float>();
  cpu::parallel_rows(threads_, out.rows(), [&](int64_t row) {
    const float* token_row = table + static_cast<int64_t>(ids[row]) * cols;
    float* out_row = result + row * cols;
    if (positions) {
      const float* position_row = positions + (row % seq_len) * cols;
      for (int64_t c = 0; c < cols; ++c) out_row[c] = token_row[c] + position_row[c];
    } else {
      for (int64_t c = 0; c < cols; ++c) out_row[c] = token_row[c];
    }
  });
}

void CpuBackend::impl_embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                                         const Tensor& dposition_table, int64_t seq_len) {
  cpu::require_f32("embedding_backward", {&dout, &dtoken_table, &dposition_table});
  check_tokens("embedding_backward", tokens, dtoken_table.rows());
  MXTRAIN_ASSERT(!dposition_table.defined() || (dposition_table.rows() >= seq_len &&
                                                dposition_table.cols() == dout.cols()),
                 "embedding_backward: position gradient %s for seq_len %lld", dposition_table.describe().c_str(),
                 static_cast<long long>(seq_len));
  const int64_t rows = dout.rows();
  const int64_t cols = dout.cols();
  const int32_t* ids = tokens.ptr<int32_t>();
  const float* grad = dout.ptr<float>();
  float* dtable = dtoken_table.ptr<float>();
  float* dpositions = dposition_table.defined() ? dposition_table.ptr<float>() : nullptr;
  cpu::parallel_blocks(threads_, cols, kColumnBlock, [&](int64_t begin, int64_t end) {
    for (int64_t row = 0; row < rows; ++row) {
      const float* grad_row = grad + row * cols;
      float* table_row = dtable + static_cast<int64_t>(ids[row]) * cols;
      for (int64_t c = begin; c < end; ++c) table_row[c] += grad_row[c];
      if (dpositions) {
        float* position_row = dpositions + (row % seq_len) * cols;
        for (int64_t c = begin; c < end; ++c) position_row[c] += grad_row[c];
      }
    }
  });
}

}  // namespace mxtrain
