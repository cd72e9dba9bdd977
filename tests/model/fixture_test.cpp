// The whole model against PyTorch: loss and every parameter gradient of a tiny Llama and a tiny
// GPT-2, for fixed weights and tokens, from fixtures written by tests/reference/make_fixtures.py
// (PyTorch, float64). mxtrain's CPU backend computes in FP32, so each gradient must agree to
// 1e-5 in relative L2 error, and the loss to 1e-5 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/model/transformer.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

class FixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, LossAndEveryGradientMatchPyTorch) {
  const std::string path = test::source_dir() + "/tests/reference/" + GetParam();
  std::ifstream in(path);
  ASSERT_TRUE(in) << path << " is missing: run `python3 tests/reference/make_fixtures.py tests/reference` where "
                             "PyTorch is installed and commit the files";
  nlohmann::json fixture = nlohmann::json::parse(in);

  RunConfig run;
  std::vector<Field> list = fields(run);
  for (const auto& [key, value] : fixture["model"].items()) {
    std::string text = value.is_string() ? value.get<std::string>() : value.dump();
    for (Field& field : list)
      if (field.key == "model." + key) field.set(text);
  }
  const ModelConfig& config = run.model;
  std::unique_ptr<Backend> backend = create_backend("cpu");
  LocalParameterStore store(*backend, config, DType::f32, DType::f32);
  store.initialize(0);
  const ModelLayout& layout = store.layout();
  int loaded = 0;
  for (const auto& [name, values] : fixture["params"].items()) {
    int group = -1, index = -1;
    ASSERT_TRUE(layout.locate(name, &group, &index)) << "fixture parameter " << name << " unknown to mxtrain";
    std::vector<float> host = values.get<std::vector<float>>();
    Tensor weight = store.weight(group, index);
    ASSERT_EQ(static_cast<int64_t>(host.size()), weight.numel()) << name;
    backend->copy_from_host(host.data(), weight);
    ++loaded;
  }
  int expected_count = 0;
  for (const ParamGroup& group : layout.groups) expected_count += static_cast<int>(group.params.size());
  EXPECT_EQ(loaded, expected_count) << "every mxtrain parameter must come from the fixture";

  const int64_t batch = fixture["batch"], seq = fixture["seq"], rows = batch * seq;
  Buffer tokens = test::upload_i32(*backend, fixture["tokens"].get<std::vector<int32_t>>(), Shape{rows}, "tokens");
  Buffer targets = test::upload_i32(*backend, fixture["targets"].get<std::vector<int32_t>>(), Shape{rows}, "targets");
  Buffer loss = backend->allocate("loss", Shape{1}, DType::f32, Lifetime::scratch);
  backend->fill(loss, 0);
  Transformer model(config, TransformerOptions{}, *backend, store);
  model.forward_backward(tokens, targets, batch, seq, 1.0f / static_cast<float>(rows), loss);
  const double mean_loss = backend->read_scalar(loss) / static_cast<double>(rows);
  const double reference_loss = fixture["loss"];
  EXPECT_NEAR(mean_loss, reference_loss, 1e-5 * std::fabs(reference_loss));

  for (const auto& [name, values] : fixture["grads"].items()) {
    int group = -1, index = -1;
    ASSERT_TRUE(layout.locate(name, &group, &index));
    std::vector<float> reference = values.get<std::vector<float>>();
    std::vector<float> grad = test::download(*backend, store.grad(group, index));
    EXPECT_LT(test::relative_l2_error(grad, reference), 1e-5) << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, FixtureTest, ::testing::Values("tiny_llama.json", "tiny_gpt2.json"),
                         [](const auto& info) { return info.param.substr(0, info.param.find('.')); });

}  // namespace
}  // namespace mxtrain
