// Import against transformers itself: tiny random Llama (GQA, tied and untied) and GPT-2 (saved
// in shards) written by save_pretrained on the GPU machine (tests/reference/make_hf_fixtures.py,
// committed under tests/reference/hf/), loaded through HfCheckpoint into a store on the CPU: the
// mean cross-entropy of the fixed tokens equals the loss transformers computed to 1e-5 relative,
// and every logit equals transformers' to 1e-4 (relative L2, and the largest error against the
// largest logit).
// The Llama 3 fixture has rope_scaling llama3 (factor 8 over 32 original positions, so the 16
// tokens cross its frequency bands).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/interop/hf_checkpoint.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/model/transformer.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

class HfFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(HfFixture, LossAndLogitsEqualTransformers) {
  const std::string dir = test::source_dir() + "/tests/reference/hf/" + GetParam();
  std::ifstream in(dir + "/expected.json");
  ASSERT_TRUE(in) << dir << " is missing: run tests/reference/make_hf_fixtures.py on the GPU machine";
  const nlohmann::json expected = nlohmann::json::parse(in);
  const interop::HfCheckpoint checkpoint(dir);
  const ModelConfig& config = checkpoint.config();
  checkpoint.check(build_layout(config));

  std::unique_ptr<Backend> backend = create_backend("cpu");
  LocalParameterStore store(*backend, config, DType::f32, DType::f32);
  store.initialize(checkpoint.parameter_values());
  std::vector<int32_t> input, targets;
  for (const auto& row : expected["input"]) for (int32_t t : row.get<std::vector<int32_t>>()) input.push_back(t);
  for (const auto& row : expected["targets"]) for (int32_t t : row.get<std::vector<int32_t>>()) targets.push_back(t);
  const int64_t batch = static_cast<int64_t>(expected["input"].size());
  const int64_t seq = static_cast<int64_t>(input.size()) / batch;
  Buffer tokens = test::upload_i32(*backend, input, Shape{batch * seq}, "tokens");
  Buffer target_buffer = test::upload_i32(*backend, targets, Shape{batch * seq}, "targets");
  Buffer loss_sum = backend->allocate("loss", Shape{1}, DType::f32, Lifetime::scratch);
  backend->fill(loss_sum, 0);
  Transformer model(config, TransformerOptions{}, *backend, store);
  model.forward_loss(tokens, target_buffer, batch, seq, loss_sum);
  const double loss = backend->read_scalar(loss_sum) / static_cast<double>(batch * seq);
  const double reference = expected["loss"].get<double>();
  EXPECT_LE(std::abs(loss - reference) / reference, 1e-5) << GetParam() << ": mxtrain " << loss << ", transformers "
                                                          << reference << " (" << expected["transformers"] << ")";

  // Every row's logits over the real vocabulary (the padding rows of the head are zero).
  Buffer logits = backend->allocate("logits", Shape{batch * seq, config.padded_vocab}, DType::f32, Lifetime::scratch);
  model.forward_logits(tokens, batch, seq, 0, logits);
  std::vector<float> all(static_cast<size_t>(batch * seq * config.padded_vocab)), ours;
  backend->copy_to_host(logits, all.data());
  for (int64_t r = 0; r < batch * seq; ++r)
    ours.insert(ours.end(), all.begin() + r * config.padded_vocab, all.begin() + r * config.padded_vocab + config.vocab_size);
  const std::vector<float> theirs = expected["logits"].get<std::vector<float>>();
  ASSERT_EQ(ours.size(), theirs.size());
  float largest = 0, worst = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    largest = std::max(largest, std::abs(theirs[i]));
    worst = std::max(worst, std::abs(ours[i] - theirs[i]));
  }
  EXPECT_LE(test::relative_l2_error(ours, theirs), 1e-4) << GetParam();
  EXPECT_LE(worst, 1e-4f * largest) << GetParam() << ": largest logit " << largest;
}

INSTANTIATE_TEST_SUITE_P(Models, HfFixture,
                         ::testing::Values("llama_gqa_untied", "llama_gqa_tied", "llama3_rope_scaling", "gpt2",
                                           "llama_bias"));

}  // namespace
}  // namespace mxtrain
