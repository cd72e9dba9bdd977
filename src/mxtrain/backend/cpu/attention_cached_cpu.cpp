// Attention of new tokens against a key/value cache (generation), the plain way: one task per
// query head; each new row scores its keys, takes the softmax with the row maximum subtracted and
// sums the values in key order. A decode step has one query row, so there is nothing to tile;
// the result agrees with attention_forward's row to rounding (another summation order).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"

namespace mxtrain {

void CpuBackend::impl_attention_cached(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                                       const Tensor& out, const AttentionShape& shape) {
  cpu::require_f32("attention_cached", {&qkv, &k_cache, &v_cache, &out});
  const int64_t dim = shape.head_dim, heads = shape.heads, kv_heads = shape.kv_heads;
  const int64_t past = shape.position_offset, seq = shape.seq, kv_cols = kv_heads * dim;
  const int64_t cols = qkv.cols(), group = heads / kv_heads;
  const float scale = shape.softmax_scale > 0 ? shape.softmax_scale : 1.0f / std::sqrt(static_cast<float>(dim));
  const float* source = qkv.ptr<float>();
  float* keys = k_cache.ptr<float>();
  float* values = v_cache.ptr<float>();
  // The new rows' keys and values join the cache first: each row attends to itself.
  for (int64_t i = 0; i < seq; ++i) {
    std::memcpy(keys + (past + i) * kv_cols, source + i * cols + heads * dim, static_cast<size_t>(kv_cols) * 4);
    std::memcpy(values + (past + i) * kv_cols, source + i * cols + (heads + kv_heads) * dim,
                static_cast<size_t>(kv_cols) * 4);
  }
  float* result = out.ptr<float>();
  cpu::parallel_rows(threads_, heads, [&](int64_t head) {
    const int64_t kv_head = head / group;
    std::vector<float> scores(static_cast<size_t>(past + seq));
    for (int64_t i = 0; i < seq; ++i) {
      const float* q = source + i * cols + head * dim;
      const int64_t count = past + i + 1;
      float top = -INFINITY;
      for (int64_t j = 0; j < count; ++j) {
        const float* k = keys + j * kv_cols + kv_head * dim;
        float dot = 0;
        for (int64_t d = 0; d < dim; ++d) dot += q[d] * k[d];
        scores[static_cast<size_t>(j)] = dot * scale;
        top = std::max(top, dot * scale);
      }
      float total = 0;
      for (int64_t j = 0; j < count; ++j) total += scores[static_cast<size_t>(j)] = std::exp(scores[static_cast<size_t>(j)] - top);
      float* o = result + i * out.cols() + head * dim;
      std::fill(o, o + dim, 0.0f);
      for (int64_t j = 0; j < count; ++j) {
        const float p = scores[static_cast<size_t>(j)] / total;
        const float* v = values + j * kv_cols + kv_head * dim;
        for (int64_t d = 0; d < dim; ++d) o[d] += p * v[d];
      }
    }
  });
}

}  // namespace mxtrain
