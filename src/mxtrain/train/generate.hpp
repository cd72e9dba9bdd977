// Sampling text from a model: `mxtrain generate` and the trainer's periodic samples
// (log.sample_every). The prompt runs through the model once (the prefill) and fills a key/value
// cache (Transformer::forward_cached); each new token then runs alone against the cache, reads
// its logits and draws from them: temperature, then top-k, then top-p (nucleus), from a seeded
// generator, so a seed gives the same text on every run of the same model.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/model/transformer.hpp"

namespace mxtrain {

struct SamplingOptions {
  int64_t max_tokens = 64;
  double temperature = 0.8;  // 0: the most likely token every time
  int64_t top_k = 0;         // 0: no limit
  double top_p = 1.0;        // keep the smallest set of tokens whose probability reaches top_p
  uint64_t seed = 0;
  int32_t stop_token = -1;   // end of sequence (EOS); -1: none
};

// Draws one token from `logits` [vocab] (the model's real vocabulary, padding excluded).
int32_t sample_token(const std::vector<float>& logits, const SamplingOptions& options, uint64_t draw);

// Continues `prompt` (token ids, at least one) by up to options.max_tokens tokens; returns the new
// ones (the stop token excluded). The context window is `max_context` tokens: a longer text
// continues from the last max_context / 2 tokens once the window is full (the cache is rebuilt
// from them, positions from 0), as llama.cpp's context shift does, instead of re-running the
// whole window for every token.
std::vector<int32_t> generate_tokens(Transformer& model, Backend& backend, const std::vector<int32_t>& prompt,
                                     int64_t max_context, const SamplingOptions& options);

}  // namespace mxtrain
