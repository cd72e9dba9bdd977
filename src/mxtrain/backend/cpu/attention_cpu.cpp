// Causal grouped-query attention, forward and backward, flash-attention style: the forward
// keeps only out and the row log-sum-exp; the backward recomputes the probabilities from q, k
// and lse. No T×T matrix outlives a step: a step handles a block of 4 query rows, with scratch
// rows of scores for those 4 rows and the kv head's keys (and values) transposed to [dim, seq].
//
// Trick: three small register-tiled kernels do the products — 4 rows × 16 columns of
// accumulators stay in registers while the shared dimension streams past, so each loaded key,
// value or query element feeds 4 to 16 multiply-adds (one-column versions take the head_dim
// columns past the last whole tile). Every sum runs over its index in order
// (d for scores, keys for outputs, query rows for dk/dv), so the kernels reassociate nothing.
//
// Determinism: the forward runs one task per (batch, query head); the backward one task per
// (batch, kv head), which loops over the query heads sharing that kv head in head order and over
// query blocks in order, so dk and dv are summed in one fixed order by their only owner. The
// per-head functions are compiled twice (x86-64-v3 with FMA, and baseline) and picked once by
// CPU at load time; on a given machine every run takes the same path, whatever the thread count.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MXTRAIN_SIMD_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MXTRAIN_SIMD_CLONES
#endif
#define MXTRAIN_INLINE __attribute__((always_inline)) inline

namespace mxtrain {
namespace {

constexpr int kRows = 4;       // query rows per block
constexpr int64_t kTile = 16;  // columns per register tile (two AVX registers)

// Where one (batch, head) lives inside the packed tensors. Row t of q/k/v is at base + t*stride.
struct HeadView {
  const float* q = nullptr;  // [seq, dim] with row stride qkv_stride
  const float* k = nullptr;
  const float* v = nullptr;
  int64_t qkv_stride = 0;
  const float* out = nullptr;   // forward output rows, stride out_stride (backward reads it)
  const float* dout = nullptr;  // backward only
  int64_t out_stride = 0;
  int64_t seq = 0, dim = 0;
  float scale = 0;
};

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// Per-thread scratch, sized once per op call. Key columns are padded to a whole tile (zeros).
struct Scratch {
  int64_t padded_seq;
  std::vector<float> keys_t, values_t;      // [dim, padded_seq]
  std::vector<float> scores, dscores;       // [kRows, padded_seq]
  std::vector<float> rows_out;              // [kRows, dim]
  std::vector<float> zero_row;              // [dim]: stands in for rows past the sequence's end
  std::vector<float> dkeys, dvalues;        // [seq, dim] (backward)
  Scratch(int64_t seq, int64_t dim, bool backward)
      : padded_seq(round_up(seq, kTile)),
        keys_t(static_cast<size_t>(dim * padded_seq), 0.0f),
        values_t(backward ? static_cast<size_t>(dim * padded_seq) : 0, 0.0f),
        scores(static_cast<size_t>(kRows * padded_seq)),
        dscores(backward ? static_cast<size_t>(kRows * padded_seq) : 0),
        rows_out(static_cast<size_t>(kRows * dim)),
        zero_row(static_cast<size_t>(dim), 0.0f),
        dkeys(backward ? static_cast<size_t>(seq * dim) : 0),
        dvalues(backward ? static_cast<size_t>(seq * dim) : 0) {}
};

// to[d * padded_seq + j] = from[j * stride + d], 16 rows at a time so both sides stay in cache.
void transpose_head(const float* from, int64_t stride, int64_t seq, int64_t dim, int64_t padded_seq, float* to) {
  for (int64_t j0 = 0; j0 < seq; j0 += kTile) {
    const int64_t rows = std::min(kTile, seq - j0);
    for (int64_t d = 0; d < dim; ++d)
      for (int64_t j = j0; j < j0 + rows; ++j) to[d * padded_seq + j] = from[j * stride + d];
  }
}

// Eight floats in one AVX register (two SSE registers in the baseline clone). Loads and stores
// go through memcpy, so no alignment is assumed.
typedef float Vec8 __attribute__((vector_size(32)));
// (By reference: a Vec8 passed or returned by value would have a different ABI in the two clones.)
MXTRAIN_INLINE void load8(Vec8& value, const float* from) { std::memcpy(&value, from, sizeof value); }
MXTRAIN_INLINE void store8(float* to, const Vec8& value) { std::memcpy(to, &value, sizeof value); }

// out[r][j] = Σ_d rows[r][d] · matrix_t[d][j] for the tile j in [col, col + 16).
MXTRAIN_INLINE void tile_rows_times_transposed(const float* const* rows, int64_t dim, const float* matrix_t,
                                               int64_t padded_seq, int64_t col, float* out, int64_t out_stride) {
  Vec8 acc[kRows][2] = {};
  for (int64_t d = 0; d < dim; ++d) {
    Vec8 low, high;
    load8(low, matrix_t + d * padded_seq + col);
    load8(high, matrix_t + d * padded_seq + col + 8);
    for (int r = 0; r < kRows; ++r) {
      const float factor = rows[r][d];
      acc[r][0] += factor * low;
      acc[r][1] += factor * high;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    store8(out + r * out_stride + col, acc[r][0]);
    store8(out + r * out_stride + col + 8, acc[r][1]);
  }
}

// out[r][d] = Σ_{j < count} weights[r][j] · matrix[j][d] for d in the tile [col, col + 16).
MXTRAIN_INLINE void tile_weights_times_rows(const float* weights, int64_t weight_stride, int64_t count,
                                            const float* matrix, int64_t stride, int64_t col, float* out,
                                            int64_t out_stride) {
  Vec8 acc[kRows][2] = {};
  for (int64_t j = 0; j < count; ++j) {
    Vec8 low, high;
    load8(low, matrix + j * stride + col);
    load8(high, matrix + j * stride + col + 8);
    for (int r = 0; r < kRows; ++r) {
      const float factor = weights[r * weight_stride + j];
      acc[r][0] += factor * low;
      acc[r][1] += factor * high;
    }
  }
  for (int r = 0; r < kRows; ++r) {
    store8(out + r * out_stride + col, acc[r][0]);
    store8(out + r * out_stride + col + 8, acc[r][1]);
  }
}

// The same for one column d = col (head_dim past its last whole tile).
MXTRAIN_INLINE void column_weights_times_rows(const float* weights, int64_t weight_stride, int64_t count,
                                              const float* matrix, int64_t stride, int64_t col, float* out,
                                              int64_t out_stride) {
  float acc[kRows] = {};
  for (int64_t j = 0; j < count; ++j)
    for (int r = 0; r < kRows; ++r) acc[r] += weights[r * weight_stride + j] * matrix[j * stride + col];
  for (int r = 0; r < kRows; ++r) out[r * out_stride + col] = acc[r];
}

// matrix[j][d] += Σ_r weights[r][j] · rows[r][d] for j < count and d in the tile [col, col + 16):
// the transposed product that accumulates dk and dv, with the 4 rows' tile held in registers.
MXTRAIN_INLINE void tile_add_transposed_weights(const float* weights, int64_t weight_stride, int64_t count,
                                                const float* const* rows, int64_t col, float* matrix,
                                                int64_t dim) {
  Vec8 held[kRows][2];
  for (int r = 0; r < kRows; ++r) {
    load8(held[r][0], rows[r] + col);
    load8(held[r][1], rows[r] + col + 8);
  }
  for (int64_t j = 0; j < count; ++j) {
    float* target = matrix + j * dim + col;
    Vec8 low, high;
    load8(low, target);
    load8(high, target + 8);
    for (int r = 0; r < kRows; ++r) {
      const float factor = weights[r * weight_stride + j];
      low += factor * held[r][0];
      high += factor * held[r][1];
    }
    store8(target, low);
    store8(target + 8, high);
  }
}

// The same for one column d = col.
MXTRAIN_INLINE void column_add_transposed_weights(const float* weights, int64_t weight_stride, int64_t count,
                                                  const float* const* rows, int64_t col, float* matrix,
                                                  int64_t dim) {
  for (int64_t j = 0; j < count; ++j) {
    float sum = matrix[j * dim + col];
    for (int r = 0; r < kRows; ++r) sum += weights[r * weight_stride + j] * rows[r][col];
    matrix[j * dim + col] = sum;
  }
}

// The two products over head_dim columns: whole tiles, then the columns past the last tile.
MXTRAIN_INLINE void weights_times_rows(const float* weights, int64_t weight_stride, int64_t count, const float* matrix,
                                       int64_t stride, int64_t dim, float* out) {
  int64_t col = 0;
  for (; col + kTile <= dim; col += kTile)
    tile_weights_times_rows(weights, weight_stride, count, matrix, stride, col, out, dim);
  for (; col < dim; ++col) column_weights_times_rows(weights, weight_stride, count, matrix, stride, col, out, dim);
}

MXTRAIN_INLINE void add_transposed_weights(const float* weights, int64_t weight_stride, int64_t count,
                                           const float* const* rows, int64_t dim, float* matrix) {
  int64_t col = 0;
  for (; col + kTile <= dim; col += kTile)
    tile_add_transposed_weights(weights, weight_stride, count, rows, col, matrix, dim);
  for (; col < dim; ++col) column_add_transposed_weights(weights, weight_stride, count, rows, col, matrix, dim);
}

// Pointers to the block's rows (t0 + r) of a [seq, dim] head, the zero row past the end.
void block_rows(const float* base, int64_t stride, int64_t t0, int64_t rows, const float* zero, const float* out[kRows]) {
  for (int r = 0; r < kRows; ++r) out[r] = r < rows ? base + (t0 + r) * stride : zero;
}

MXTRAIN_SIMD_CLONES
void forward_head(const HeadView& view, float* out, int64_t out_stride, float* lse, Scratch& scratch) {
  const int64_t seq = view.seq, dim = view.dim, padded = scratch.padded_seq;
  float* scores = scratch.scores.data();
  float* block_out = scratch.rows_out.data();
  transpose_head(view.k, view.qkv_stride, seq, dim, padded, scratch.keys_t.data());
  for (int64_t t0 = 0; t0 < seq; t0 += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, seq - t0);
    const int64_t count = t0 + rows;  // causal: the block sees keys [0, count)
    const float* q_rows[kRows];
    block_rows(view.q, view.qkv_stride, t0, rows, scratch.zero_row.data(), q_rows);
    for (int64_t col = 0; col < count; col += kTile)
      tile_rows_times_transposed(q_rows, dim, scratch.keys_t.data(), padded, col, scores, padded);
    float inverse_total[kRows] = {};
    for (int64_t r = 0; r < kRows; ++r) {
      float* p = scores + r * padded;
      if (r >= rows) {
        std::fill(p, p + count, 0.0f);
        continue;
      }
      const int64_t visible = t0 + r + 1;
      float maximum = -std::numeric_limits<float>::infinity();
      for (int64_t j = 0; j < visible; ++j) {
        p[j] *= view.scale;
        maximum = p[j] > maximum ? p[j] : maximum;
      }
      for (int64_t j = 0; j < visible; ++j) p[j] = std::exp(p[j] - maximum);
      double total = 0;
      for (int64_t j = 0; j < visible; ++j) total += p[j];
      std::fill(p + visible, p + count, 0.0f);
      inverse_total[r] = static_cast<float>(1.0 / total);
      lse[t0 + r] = static_cast<float>(static_cast<double>(maximum) + std::log(total));
    }
    weights_times_rows(scores, padded, count, view.v, view.qkv_stride, dim, block_out);
    for (int64_t r = 0; r < rows; ++r) {
      float* out_row = out + (t0 + r) * out_stride;
      for (int64_t d = 0; d < dim; ++d) out_row[d] = block_out[r * dim + d] * inverse_total[r];
    }
  }
}

// Adds this query head's contribution to dk, dv (scratch) and writes its dq rows.
MXTRAIN_SIMD_CLONES
void backward_head(const HeadView& view, const float* lse, float* dq, int64_t dq_stride, Scratch& scratch) {
  const int64_t seq = view.seq, dim = view.dim, padded = scratch.padded_seq;
  float* probs = scratch.scores.data();
  float* dscores = scratch.dscores.data();
  float* block_dq = scratch.rows_out.data();
  for (int64_t t0 = 0; t0 < seq; t0 += kRows) {
    const int64_t rows = std::min<int64_t>(kRows, seq - t0);
    const int64_t count = t0 + rows;
    const float* q_rows[kRows];
    const float* dout_rows[kRows];
    block_rows(view.q, view.qkv_stride, t0, rows, scratch.zero_row.data(), q_rows);
    block_rows(view.dout, view.out_stride, t0, rows, scratch.zero_row.data(), dout_rows);
    // P = exp(scale·q·Kᵀ − lse), dP = dout·Vᵀ, dS = P ∘ (dP − rowsum(dout ∘ out)) · scale.
    for (int64_t col = 0; col < count; col += kTile) {
      tile_rows_times_transposed(q_rows, dim, scratch.keys_t.data(), padded, col, probs, padded);
      tile_rows_times_transposed(dout_rows, dim, scratch.values_t.data(), padded, col, dscores, padded);
    }
    for (int64_t r = 0; r < kRows; ++r) {
      float* p = probs + r * padded;
      float* ds = dscores + r * padded;
      const int64_t visible = r < rows ? t0 + r + 1 : 0;
      if (visible > 0) {
        const float* out_row = view.out + (t0 + r) * view.out_stride;
        double delta = 0;
        for (int64_t d = 0; d < dim; ++d) delta += static_cast<double>(dout_rows[r][d]) * out_row[d];
        const float row_delta = static_cast<float>(delta), row_lse = lse[t0 + r];
        for (int64_t j = 0; j < visible; ++j) {
          p[j] = std::exp(p[j] * view.scale - row_lse);
          ds[j] = p[j] * (ds[j] - row_delta) * view.scale;  // gradient of the unscaled q·k
        }
      }
      std::fill(p + visible, p + count, 0.0f);
      std::fill(ds + visible, ds + count, 0.0f);
    }
    weights_times_rows(dscores, padded, count, view.k, view.qkv_stride, dim, block_dq);
    for (int64_t r = 0; r < rows; ++r) std::copy(block_dq + r * dim, block_dq + (r + 1) * dim, dq + (t0 + r) * dq_stride);
    add_transposed_weights(dscores, padded, count, q_rows, dim, scratch.dkeys.data());
    add_transposed_weights(probs, padded, count, dout_rows, dim, scratch.dvalues.data());
  }
}

float softmax_scale_of(const AttentionShape& shape) {
  return shape.softmax_scale != 0 ? shape.softmax_scale
                                  : 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
}

}  // namespace

void CpuBackend::impl_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                        const AttentionShape& shape) {
  cpu::require_f32("attention_forward", {&qkv, &out, &lse});
  const int64_t batch = shape.batch, seq = shape.seq, heads = shape.heads, dim = shape.head_dim;
  const int64_t group = heads / shape.kv_heads;
  const int64_t qkv_stride = qkv.cols(), out_stride = out.cols();
  const int64_t tasks = batch * heads;
  const float scale = softmax_scale_of(shape);
  const float* base = qkv.ptr<float>();
  float* out_base = out.ptr<float>();
  float* lse_base = lse.ptr<float>();
#pragma omp parallel num_threads(threads_) if (tasks > 1 && threads_ > 1)
  {
    Scratch scratch(seq, dim, false);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / heads, h = task % heads, kv = h / group;
      const float* rows = base + b * seq * qkv_stride;
      HeadView view;
      view.q = rows + h * dim;
      view.k = rows + (heads + kv) * dim;
      view.v = rows + (heads + shape.kv_heads + kv) * dim;
      view.qkv_stride = qkv_stride;
      view.seq = seq;
      view.dim = dim;
      view.scale = scale;
      forward_head(view, out_base + b * seq * out_stride + h * dim, out_stride, lse_base + task * seq, scratch);
    }
  }
}

void CpuBackend::impl_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                         const Tensor& dqkv, const AttentionShape& shape) {
  cpu::require_f32("attention_backward", {&dout, &qkv, &out, &lse, &dqkv});
  MXTRAIN_ASSERT(lse.numel() == shape.batch * shape.heads * shape.seq && out.cols() == shape.heads * shape.head_dim,
                 "attention_backward: lse %s, out %s", lse.describe().c_str(), out.describe().c_str());
  const int64_t batch = shape.batch, seq = shape.seq, heads = shape.heads, kv_heads = shape.kv_heads;
  const int64_t dim = shape.head_dim, group = heads / kv_heads;
  const int64_t qkv_stride = qkv.cols(), out_stride = out.cols();
  const int64_t tasks = batch * kv_heads;
  const float scale = softmax_scale_of(shape);
  const float* base = qkv.ptr<float>();
  const float* out_base = out.ptr<float>();
  const float* dout_base = dout.ptr<float>();
  const float* lse_base = lse.ptr<float>();
  float* grad_base = dqkv.ptr<float>();
#pragma omp parallel num_threads(threads_) if (tasks > 1 && threads_ > 1)
  {
    Scratch scratch(seq, dim, true);
#pragma omp for schedule(static)
    for (int64_t task = 0; task < tasks; ++task) {
      const int64_t b = task / kv_heads, kv = task % kv_heads;
      const float* rows = base + b * seq * qkv_stride;
      float* grad_rows = grad_base + b * seq * qkv_stride;
      HeadView view;
      view.k = rows + (heads + kv) * dim;
      view.v = rows + (heads + kv_heads + kv) * dim;
      view.qkv_stride = qkv_stride;
      view.out_stride = out_stride;
      view.seq = seq;
      view.dim = dim;
      view.scale = scale;
      transpose_head(view.k, qkv_stride, seq, dim, scratch.padded_seq, scratch.keys_t.data());
      transpose_head(view.v, qkv_stride, seq, dim, scratch.padded_seq, scratch.values_t.data());
      std::fill(scratch.dkeys.begin(), scratch.dkeys.end(), 0.0f);
      std::fill(scratch.dvalues.begin(), scratch.dvalues.end(), 0.0f);
      for (int64_t h = kv * group; h < (kv + 1) * group; ++h) {
        view.q = rows + h * dim;
        view.out = out_base + b * seq * out_stride + h * dim;
        view.dout = dout_base + b * seq * out_stride + h * dim;
        backward_head(view, lse_base + (b * heads + h) * seq, grad_rows + h * dim, qkv_stride, scratch);
      }
      for (int64_t j = 0; j < seq; ++j) {
        std::copy(scratch.dkeys.begin() + j * dim, scratch.dkeys.begin() + (j + 1) * dim,
                  grad_rows + j * qkv_stride + (heads + kv) * dim);
        std::copy(scratch.dvalues.begin() + j * dim, scratch.dvalues.begin() + (j + 1) * dim,
                  grad_rows + j * qkv_stride + (heads + kv_heads + kv) * dim);
      }
    }
  }
}

}  // namespace mxtrain
