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
  const DType dtype = model.options().activation_dtype;
  // Room for the whole text when it fits the window: then no token is ever run twice.
  const int64_t capacity =
      std::min<int64_t>(max_context, static_cast<int64_t>(prompt.size()) + std::max<int64_t>(options.max_tokens, 1));
  KvCache cache = model.make_kv_cache(capacity);
  Buffer logits = backend.allocate("generate.logits", Shape{1, config.padded_vocab}, dtype, Lifetime::scratch);
  Buffer wide = dtype == DType::f32 ? Buffer()
                                    : backend.allocate("generate.logits_f32", Shape{1, config.padded_vocab}, DType::f32,
                                                       Lifetime::scratch);
  std::vector<int32_t> sequence = prompt, produced;
  std::vector<float> row(static_cast<size_t>(config.padded_vocab));
  // Runs tokens [begin, end) of the sequence through the cache; the last one's logits land in row.
  auto run = [&](size_t begin, size_t end) {
    const int64_t count = static_cast<int64_t>(end - begin);
    Buffer tokens = backend.allocate("generate.tokens", Shape{count}, DType::i32, Lifetime::data);
    backend.copy_from_host(sequence.data() + begin, tokens);
    model.forward_cached(tokens, cache, logits);
    if (dtype == DType::f32) {
      backend.copy_to_host(logits, row.data());
    } else {
      backend.copy(logits, wide);
      backend.copy_to_host(wide, row.data());
    }
  };
  // The prompt's last `capacity` tokens fill the cache in one pass (the prefill).
  run(sequence.size() - static_cast<size_t>(std::min<int64_t>(capacity, static_cast<int64_t>(sequence.size()))),
      sequence.size());
  for (int64_t step = 0; step < options.max_tokens; ++step) {
    const std::vector<float> real(row.begin(), row.begin() + config.vocab_size);
    const int32_t next = sample_token(real, options, static_cast<uint64_t>(step));
    if (next == options.stop_token) break;
    sequence.push_back(next);
    produced.push_back(next);
    if (step + 1 == options.max_tokens) break;  // its logits would go unused
    if (cache.length == cache.capacity) {
      // The window is full: start again from its last half (positions restart at 0), so the
      // cost stays one prefill per capacity / 2 tokens.
      cache.length = 0;
      const size_t keep = static_cast<size_t>(std::max<int64_t>(1, capacity / 2));
      run(sequence.size() - keep, sequence.size());
    } else {
      run(sequence.size() - 1, sequence.size());
    }
  }
  return produced;
}

}  // namespace mxtrain
