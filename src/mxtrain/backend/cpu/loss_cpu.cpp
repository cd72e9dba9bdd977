// Softmax cross-entropy over a padded vocabulary. Trick: the loss and its gradient come from one
// row's max and sum of exponentials, so the gradient overwrites the logits in place and full f32
// probabilities never exist beside them. Each row's sum of exponentials is taken in double
// (a 128k-column row of f32 terms would otherwise lose several digits of the loss); columns at
// or past valid_vocab are padding: never read, and zeroed in the gradient.
#include <cmath>
#include <limits>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"

namespace mxtrain {

void CpuBackend::impl_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                                    int64_t valid_vocab, float grad_scale) {
  cpu::require_f32("cross_entropy", {&logits, &losses});
  const int64_t rows = logits.rows(), cols = logits.cols();
  const int32_t* target_ids = targets.ptr<int32_t>();
  // The data loader validates targets; one out of range here is a bug upstream.
  for (int64_t row = 0; row < rows; ++row) {
    MXTRAIN_ASSERT(target_ids[row] >= 0 && target_ids[row] < valid_vocab,
                   "cross_entropy: target %d of row %lld outside the vocabulary of %lld", target_ids[row],
                   static_cast<long long>(row), static_cast<long long>(valid_vocab));
  }
  float* data = logits.ptr<float>();
  float* loss = losses.ptr<float>();
  cpu::parallel_rows(threads_, rows, [&](int64_t row) {
    float* logit_row = data + row * cols;
    const int64_t target = target_ids[row];
    float maximum = -std::numeric_limits<float>::infinity();
    for (int64_t c = 0; c < valid_vocab; ++c) maximum = logit_row[c] > maximum ? logit_row[c] : maximum;
    double total = 0;
    for (int64_t c = 0; c < valid_vocab; ++c) total += std::exp(logit_row[c] - maximum);
    const double log_sum_exp = static_cast<double>(maximum) + std::log(total);
    loss[row] = static_cast<float>(log_sum_exp - static_cast<double>(logit_row[target]));
    if (grad_scale == 0.0f) return;
    const float inverse_total = static_cast<float>(1.0 / total);
    for (int64_t c = 0; c < valid_vocab; ++c) {
      const float probability = std::exp(logit_row[c] - maximum) * inverse_total;
      logit_row[c] = grad_scale * (c == target ? probability - 1.0f : probability);
    }
    for (int64_t c = valid_vocab; c < cols; ++c) logit_row[c] = 0.0f;
  });
}

}  // namespace mxtrain
