// Rotary position embedding, rotate-half convention (HF Llama): pair i of a head is
// (x[i], x[i + D/2]). The cos/sin table is built the way PyTorch builds it, all in f32:
// inv_freq_i = 1 / theta^(2i/D), angle = position · inv_freq_i, then cos and sin of the f32
// angle — so the table matches torch's to the ulp of the platform's libm, not a double-precision
// ideal that torch never computes. The backward applies the transposed rotation (angle → −angle),
// which is exact as a linear map: the same cos and sin values, the sin terms negated.
#include <cmath>
#include <vector>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"

namespace mxtrain {

// out_amax: never defined here (records_output_amax() is false; Backend runs the pass).
void CpuBackend::impl_rope(const Tensor& qkv, const AttentionShape& shape, const RopeSpec& rope, bool inverse,
                           const Tensor&) {
  const char* op = inverse ? "rope_backward" : "rope_forward";
  cpu::require_f32(op, {&qkv});
  MXTRAIN_ASSERT(shape.head_dim % 2 == 0 && shape.seq > 0, "%s: head_dim %lld must be even", op,
                 static_cast<long long>(shape.head_dim));
  const int64_t dim = shape.head_dim, half = dim / 2, seq = shape.seq, offset = shape.position_offset;
  const int64_t rotated_heads = shape.heads + shape.kv_heads;  // q heads then k heads; v follows untouched
  const int64_t cols = qkv.cols();

  // cos/sin [seq, half] of (position_offset + position) * inv_freq (rope_inverse_frequencies: torch's formula).
  const std::vector<float> inv_freq = rope_inverse_frequencies(dim, rope);
  std::vector<float> cosines(static_cast<size_t>(seq * half)), sines(static_cast<size_t>(seq * half));
  cpu::parallel_rows(threads_, seq, [&](int64_t position) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(offset + position) * inv_freq[static_cast<size_t>(i)];
      cosines[static_cast<size_t>(position * half + i)] = std::cos(angle);
      sines[static_cast<size_t>(position * half + i)] = std::sin(angle);
    }
  });

  float* data = qkv.ptr<float>();
  cpu::parallel_rows(threads_, qkv.rows(), [&](int64_t row) {
    const float* cos_row = cosines.data() + (row % seq) * half;
    const float* sin_row = sines.data() + (row % seq) * half;
    for (int64_t head = 0; head < rotated_heads; ++head) {
      float* first = data + row * cols + head * dim;
      float* second = first + half;
      for (int64_t i = 0; i < half; ++i) {
        const float x1 = first[i], x2 = second[i];
        const float c = cos_row[i], s = inverse ? -sin_row[i] : sin_row[i];
        first[i] = x1 * c - x2 * s;
        second[i] = x2 * c + x1 * s;
      }
    }
  });
}

}  // namespace mxtrain
