// Generation with a key/value cache on the CPU oracle: RoPE at a position offset rotates rows as
// the full sequence's rope does (bit for bit); attention_cached gives the rows of
// attention_forward over the whole sequence; a cached forward gives the last-row logits of the
// uncached forward_logits for every prefix, both families; and generate_tokens (greedy) equals
// the token-by-token argmax of forward_logits over the growing sequence.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/model/transformer.hpp"
#include "mxtrain/train/generate.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

std::vector<float> random_values(size_t count, uint32_t seed) {
  std::vector<float> values(count);
  uint32_t state = seed * 2654435761u + 1;
  for (float& v : values) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<float>(state >> 8) / 16777216.0f * 2.0f - 1.0f;
  }
  return values;
}

double max_relative_difference(const std::vector<float>& got, const std::vector<float>& want) {
  double worst = 0, scale = 0;
  for (float w : want) scale = std::max(scale, static_cast<double>(std::fabs(w)));
  for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(static_cast<double>(got[i]) - want[i]));
  return worst / std::max(scale, 1e-30);
}

TEST(KvCache, RopeAtAnOffsetRotatesLikeTheWholeSequence) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  const AttentionShape whole{1, 11, 4, 2, 8, 0.0f};
  const std::vector<float> values = random_values(static_cast<size_t>(whole.seq * whole.qkv_cols()), 3);
  Buffer all = test::upload(*backend, values, Shape{whole.seq, whole.qkv_cols()});
  RopeSpec rope;
  rope.theta = 500000.0f;
  backend->rope_forward(all, whole, rope);
  const std::vector<float> expected = test::download(*backend, all);
  // Rows 7..10 alone, at offset 7.
  AttentionShape tail = whole;
  tail.seq = 4;
  tail.position_offset = 7;
  const size_t first = static_cast<size_t>(7 * whole.qkv_cols());
  Buffer part = test::upload(*backend, std::vector<float>(values.begin() + first, values.end()), Shape{4, whole.qkv_cols()});
  backend->rope_forward(part, tail, rope);
  EXPECT_EQ(test::download(*backend, part), std::vector<float>(expected.begin() + first, expected.end()));
}

TEST(KvCache, CachedAttentionGivesTheRowsOfTheWholeSequence) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  for (const AttentionShape whole : {AttentionShape{1, 13, 4, 2, 8, 0.0f}, AttentionShape{1, 9, 2, 2, 16, 0.3f},
                                     AttentionShape{1, 6, 4, 1, 4, 0.0f}}) {
    const int64_t cols = whole.qkv_cols(), out_cols = whole.heads * whole.head_dim;
    const std::vector<float> values = random_values(static_cast<size_t>(whole.seq * cols), 5);
    Buffer qkv = test::upload(*backend, values, Shape{whole.seq, cols});
    Buffer out = backend->allocate("out", Shape{whole.seq, out_cols}, DType::f32, Lifetime::scratch);
    Buffer lse = backend->allocate("lse", Shape{1, whole.heads, whole.seq}, DType::f32, Lifetime::scratch);
    backend->attention_forward(qkv, out, lse, whole);
    const std::vector<float> expected = test::download(*backend, out);
    // A prefill of 5 rows, then one row at a time.
    const int64_t kv_cols = whole.kv_heads * whole.head_dim;
    Buffer keys = backend->allocate("k", Shape{whole.seq, kv_cols}, DType::f32, Lifetime::scratch);
    Buffer cached_values = backend->allocate("v", Shape{whole.seq, kv_cols}, DType::f32, Lifetime::scratch);
    std::vector<float> got;
    for (int64_t begin = 0; begin < whole.seq;) {
      const int64_t count = begin == 0 ? std::min<int64_t>(5, whole.seq) : 1;
      AttentionShape step = whole;
      step.seq = count;
      step.position_offset = begin;
      Buffer rows = test::upload(*backend, std::vector<float>(values.begin() + begin * cols, values.begin() + (begin + count) * cols),
                                 Shape{count, cols});
      Buffer rows_out = backend->allocate("rows_out", Shape{count, out_cols}, DType::f32, Lifetime::scratch);
      backend->attention_cached(rows, keys, cached_values, rows_out, step);
      const std::vector<float> part = test::download(*backend, rows_out);
      got.insert(got.end(), part.begin(), part.end());
      begin += count;
    }
    EXPECT_LT(max_relative_difference(got, expected), 1e-6) << "seq " << whole.seq << " head_dim " << whole.head_dim;
  }
}

// The last row's logits of the uncached forward over tokens.
std::vector<float> uncached_last_logits(Transformer& model, Backend& backend, const std::vector<int32_t>& tokens) {
  const int64_t length = static_cast<int64_t>(tokens.size());
  Buffer ids = test::upload_i32(backend, tokens, Shape{length}, "tokens");
  Buffer logits =
      backend.allocate("logits", Shape{1, model.config().padded_vocab}, DType::f32, Lifetime::scratch);
  model.forward_logits(ids, 1, length, length - 1, logits);
  return test::download(backend, logits);
}

class KvCacheModel : public testing::TestWithParam<ModelFamily> {};

TEST_P(KvCacheModel, CachedLogitsEqualTheUncachedOnesForEveryPrefix) {
  const ModelConfig config = test::small_model(GetParam(), 2);
  std::unique_ptr<Backend> backend = create_backend("cpu");
  LocalParameterStore store(*backend, config, DType::f32, DType::f32);
  store.initialize(7);
  Transformer model(config, TransformerOptions{}, *backend, store);
  std::vector<int32_t> tokens(20);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 37 + 11) % config.vocab_size);
  KvCache cache = model.make_kv_cache(24);
  Buffer logits = backend->allocate("cached", Shape{1, config.padded_vocab}, DType::f32, Lifetime::scratch);
  // The prefill: the first 6 tokens at once.
  const int64_t prefill = 6;
  Buffer first = test::upload_i32(*backend, std::vector<int32_t>(tokens.begin(), tokens.begin() + prefill),
                                  Shape{prefill}, "prefill");
  model.forward_cached(first, cache, logits);
  EXPECT_EQ(cache.length, prefill);
  for (int64_t length = prefill;; ++length) {
    const std::vector<int32_t> prefix(tokens.begin(), tokens.begin() + length);
    EXPECT_LT(max_relative_difference(test::download(*backend, logits), uncached_last_logits(model, *backend, prefix)),
              1e-5)
        << "length " << length;
    if (length == static_cast<int64_t>(tokens.size())) break;
    Buffer next = test::upload_i32(*backend, {tokens[static_cast<size_t>(length)]}, Shape{1}, "next");
    model.forward_cached(next, cache, logits);
  }
  EXPECT_EQ(cache.length, static_cast<int64_t>(tokens.size()));
}

TEST_P(KvCacheModel, GreedyGenerationEqualsTheArgmaxOfTheUncachedForward) {
  const ModelConfig config = test::small_model(GetParam(), 2);
  std::unique_ptr<Backend> backend = create_backend("cpu");
  LocalParameterStore store(*backend, config, DType::f32, DType::f32);
  store.initialize(11);
  Transformer model(config, TransformerOptions{}, *backend, store);
  const std::vector<int32_t> prompt{5, 17, 3, 40};
  SamplingOptions greedy;
  greedy.temperature = 0;
  greedy.max_tokens = 20;
  const std::vector<int32_t> produced = generate_tokens(model, *backend, prompt, config.max_seq_len, greedy);
  ASSERT_EQ(produced.size(), 20u);
  std::vector<int32_t> sequence = prompt;
  for (int32_t token : produced) {
    const std::vector<float> logits = uncached_last_logits(model, *backend, sequence);
    const auto best = std::max_element(logits.begin(), logits.begin() + config.vocab_size) - logits.begin();
    EXPECT_EQ(token, best) << "after " << sequence.size() << " tokens";
    sequence.push_back(token);
  }
  // A window smaller than the text: generation goes on past it (the cache restarts from the
  // window's last half) and stays reproducible.
  greedy.max_tokens = 40;
  const std::vector<int32_t> long_text = generate_tokens(model, *backend, prompt, 16, greedy);
  EXPECT_EQ(long_text.size(), 40u);
  EXPECT_EQ(long_text, generate_tokens(model, *backend, prompt, 16, greedy));
  EXPECT_EQ(std::vector<int32_t>(long_text.begin(), long_text.begin() + 12),
            generate_tokens(model, *backend, prompt, 16, {.max_tokens = 12, .temperature = 0}));
}

INSTANTIATE_TEST_SUITE_P(Families, KvCacheModel, testing::Values(ModelFamily::llama, ModelFamily::gpt2),
                         [](const testing::TestParamInfo<ModelFamily>& info) {
                           return std::string(info.param == ModelFamily::llama ? "llama" : "gpt2");
                         });

}  // namespace
}  // namespace mxtrain
