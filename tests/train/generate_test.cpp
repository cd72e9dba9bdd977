// Sampling: the draw rules (temperature 0, top-k, top-p) and their statistics, reproducibility by
// seed, and `mxtrain generate` end to end on a small trained run.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "mxtrain/train/generate.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

TEST(Sampling, GreedyTopKAndTopPKeepTheLikeliest) {
  const std::vector<float> logits{0.5f, 2.0f, -1.0f, 1.9f};
  SamplingOptions greedy;
  greedy.temperature = 0;
  EXPECT_EQ(sample_token(logits, greedy, 0), 1);
  SamplingOptions top1;
  top1.top_k = 1;
  SamplingOptions nucleus;
  nucleus.top_p = 1e-3;
  for (uint64_t draw = 0; draw < 50; ++draw) {
    EXPECT_EQ(sample_token(logits, top1, draw), 1);
    EXPECT_EQ(sample_token(logits, nucleus, draw), 1);
  }
  SamplingOptions top2;
  top2.top_k = 2;
  for (uint64_t draw = 0; draw < 200; ++draw) {
    const int32_t token = sample_token(logits, top2, draw);
    EXPECT_TRUE(token == 1 || token == 3) << token;
  }
}

TEST(Sampling, FrequenciesFollowTheTemperedProbabilities) {
  // p(1) = 3/4 at temperature 1, (3^2)/(1 + 3^2) = 0.9 at temperature 0.5.
  const std::vector<float> logits{0.0f, std::log(3.0f)};
  for (double temperature : {1.0, 0.5}) {
    SamplingOptions options;
    options.temperature = temperature;
    options.seed = 11;
    int ones = 0;
    const int draws = 20000;
    for (int draw = 0; draw < draws; ++draw) ones += sample_token(logits, options, static_cast<uint64_t>(draw));
    const double expected = std::pow(3.0, 1 / temperature) / (1 + std::pow(3.0, 1 / temperature));
    EXPECT_NEAR(static_cast<double>(ones) / draws, expected, 0.015) << "temperature " << temperature;
  }
}

TEST(Generate, TheSameSeedGivesTheSameTextFromARun) {
  test::TempDir dir;
  const std::string corpus = test::make_test_corpus(dir.file("corpus"));
  const std::string mxtrain = test::binary_path();
  std::string output;
  ASSERT_EQ(test::run_command(mxtrain + " train --steps 20 -b 4 -s 64 -d cpu -o " + dir.file("run") +
                                  " --set data.train=" + corpus + "/train_*.bin --set data.val=",
                              &output),
            0)
      << output;
  auto generate = [&](const std::string& flags) {
    std::string text;
    EXPECT_EQ(test::run_command(mxtrain + " generate " + dir.file("run") + " -d cpu --prompt 'the ' --max-tokens 24 " +
                                    flags + " 2>/dev/null",
                                &text),
              0)
        << text;
    return text;
  };
  const std::string first = generate("--seed 5"), again = generate("--seed 5"), other = generate("--seed 6");
  EXPECT_EQ(first.rfind("the ", 0), 0u) << first;  // the prompt, then the continuation
  EXPECT_GT(first.size(), 10u) << first;
  EXPECT_EQ(first, again);
  EXPECT_NE(first, other);
  EXPECT_EQ(generate("--temperature 0 --seed 1"), generate("--temperature 0 --seed 2"));
  EXPECT_NE(test::run_command(mxtrain + " generate " + dir.file("nothing") + " --prompt x", &output), 0);
  EXPECT_NE(output.find("neither a checkpoint directory nor a run directory"), std::string::npos) << output;
}

}  // namespace
}  // namespace mxtrain
