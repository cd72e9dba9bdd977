#include "mxtrain/train/generate.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/philox.hpp"

namespace mxtrain {

namespace {
constexpr uint64_t kSamplingStream = 0x67656e;  // "gen": a Philox stream of its own
}  // namespace

int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& options, uint64_t draw) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  MXTRAIN_ASSERT(vocab > 0, "sampling from no logits");
  if (options.temperature <= 0)
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  std::vector<int32_t> order(static_cast<size_t>(vocab));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const int64_t keep_k = options.top_k > 0 ? std::min(options.top_k, vocab) : vocab;
  std::vector<double> probability(static_cast<size_t>(keep_k));
  const double top = logits[order[0]];
  double total = 0;
  for (int64_t i = 0; i < keep_k; ++i)
    total += probability[i] = std::exp((logits[order[i]] - top) / options.temperature);
  int64_t keep = keep_k;
  if (options.top_p < 1.0) {
    double mass = 0;
    for (keep = 0; keep < keep_k;) {
      mass += probability[keep++] / total;
      if (mass >= options.top_p) break;
    }
    total = std::accumulate(probability.begin(), probability.begin() + keep, 0.0);
  }
  // A uniform draw in [0, total) from the seed and the draw index (counter-based: reproducible).
  const double u = static_cast<double>(numerics::philox_random_word(options.seed, kSamplingStream, draw)) / 4294967296.0 * total;
  double cumulative = 0;
  for (int64_t i = 0; i < keep; ++i) {
    cumulative += probability[i];
    if (u < cumulative) return order[i];
  }
  return order[keep - 1];
}

std::vector<int32_t> generate_tokens(Transformer& model, Backend& backend, const std::vector<int32_t>& prompt,
                                     int64_t max_context, const SamplingOptions& options) {
  MXTRAIN_ASSERT(!prompt.empty() && max_context > 0, "generation needs a prompt and a context");
  const ModelConfig& config = model.config();
  std::vector<int32_t> sequence = prompt, produced;
  std::vector<float> row(static_cast<size_t>(config.padded_vocab));
  for (int64_t step = 0; step < options.max_tokens; ++step) {
    const int64_t begin = std::max<int64_t>(0, static_cast<int64_t>(sequence.size()) - max_context);
    const int64_t length = static_cast<int64_t>(sequence.size()) - begin;
    Buffer tokens = backend.allocate("generate.tokens", Shape{length}, DType::i32, Lifetime::data);
    backend.copy_from_host(sequence.data() + begin, tokens);
    // Logits in the model's activation dtype (a bf16 training run's too), read as f32.
    const DType dtype = model.options().activation_dtype;
    Buffer logits = backend.allocate("generate.logits", Shape{1, config.padded_vocab}, dtype, Lifetime::scratch);
    model.forward_logits(tokens, 1, length, length - 1, logits);
    if (dtype == DType::f32) {
      backend.copy_to_host(logits, row.data());
    } else {
      Buffer wide = backend.allocate("generate.logits_f32", Shape{1, config.padded_vocab}, DType::f32, Lifetime::scratch);
      backend.copy(logits, wide);
      backend.copy_to_host(wide, row.data());
    }
    const std::vector<float> real(row.begin(), row.begin() + config.vocab_size);
    const int32_t next = sample_token(real, options, static_cast<uint64_t>(step));
    if (next == options.stop_token) break;
    sequence.push_back(next);
    produced.push_back(next);
  }
  return produced;
}

}  // namespace mxtrain
