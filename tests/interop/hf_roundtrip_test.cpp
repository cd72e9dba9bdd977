// The command-line round trip on the CPU: train, `mxtrain export` (f32), `train --init-from` the
// export with a zero learning rate, export again: the two exports are the same bytes, and the
// imported model's held-out loss equals the exporting run's to the bit.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>

#include <nlohmann/json.hpp>

#include "support/test_support.hpp"

namespace mxtrain {
namespace {

double last_val_loss(const std::string& metrics) {
  double loss = -1;
  std::ifstream in(metrics);
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("val_loss")) loss = record["val_loss"].get<double>();
  }
  return loss;
}

void expect_round_trip(const std::string& preset, const std::string& model_settings = "") {
  test::TempDir dir;
  const std::string corpus = test::make_test_corpus(dir.file("corpus"));
  const std::string common = " -b 2 -s 32 -d cpu --set data.train=" + corpus + "/train_*.bin --set data.val=" + corpus +
                             "/val_*.bin --set eval.batches=2";
  const std::string mxtrain = test::binary_path();
  std::string output;
  ASSERT_EQ(test::run_command(mxtrain + " train -m " + preset + model_settings + " --steps 3 -o " + dir.file("run1") +
                                  common,
                              &output),
            0)
      << output;
  ASSERT_EQ(test::run_command(mxtrain + " export " + dir.file("run1") + " " + dir.file("export1") + " --dtype f32",
                              &output),
            0)
      << output;
  ASSERT_EQ(test::run_command(mxtrain + " train --init-from " + dir.file("export1") + " --steps 1 --set optimizer.lr=0 -o " +
                                  dir.file("run2") + common,
                              &output),
            0)
      << output;
  EXPECT_NE(output.find("initial weights from " + dir.file("export1")), std::string::npos) << output;
  ASSERT_EQ(test::run_command(mxtrain + " export " + dir.file("run2") + " " + dir.file("export2") + " --dtype f32",
                              &output),
            0)
      << output;
  EXPECT_EQ(test::read_file(dir.file("export1") + "/model.safetensors"), test::read_file(dir.file("export2") + "/model.safetensors"));
  EXPECT_EQ(last_val_loss(dir.file("run1") + "/metrics.jsonl"), last_val_loss(dir.file("run2") + "/metrics.jsonl"));
  // An export never overwrites: the same target again is refused and left as it was.
  EXPECT_NE(test::run_command(mxtrain + " export " + dir.file("run2") + " " + dir.file("export1"), &output), 0);
  EXPECT_NE(output.find("exists and is not empty"), std::string::npos) << output;
  // A file where the export directory goes is named as one (it was called "not empty").
  { std::ofstream(dir.file("a_file")) << "not a directory\n"; }
  EXPECT_NE(test::run_command(mxtrain + " export " + dir.file("run2") + " " + dir.file("a_file"), &output), 0);
  EXPECT_NE(output.find(dir.file("a_file") + " is a file, not a directory"), std::string::npos) << output;
}

// The export names the tokenizer files as transformers loads them: a run that trained with a
// tokenizer file of its own name (here my_bpe.json) exports it as tokenizer.json, with the
// tokenizer_config.json beside it.
TEST(HfRoundTrip, TheExportNamesTheTokenizerAsTransformersLoadsIt) {
#if !MXTRAIN_HAVE_PCRE2
  GTEST_SKIP() << "built without PCRE2";
#endif
  test::TempDir dir;
  const std::string corpus = test::make_test_corpus(dir.file("corpus"));
  const std::string tokenizer = dir.file("tok/my_bpe.json");
  std::filesystem::create_directories(dir.file("tok"));
  std::filesystem::copy_file(test::source_dir() + "/tests/fuzz/corpus/tokenizer/bpe300.json", tokenizer);
  std::ofstream(dir.file("tok/tokenizer_config.json")) << R"({"eos_token": "<|endoftext|>"})";
  const std::string mxtrain = test::binary_path();
  std::string output;
  ASSERT_EQ(test::run_command(mxtrain + " prepare --val-fraction 0.5 --tokenizer " + tokenizer + " -o " +
                                  dir.file("shards") + " " + corpus + "/corpus.txt",
                              &output),
            0)
      << output;
  ASSERT_EQ(test::run_command(mxtrain + " train -m tiny -b 2 -s 32 -d cpu --steps 1 -o " + dir.file("run") +
                                  " --set model.vocab_size=320 --set data.tokenizer=" + tokenizer +
                                  " --set data.train=" + dir.file("shards") + "/train_*.bin --set data.val=" +
                                  dir.file("shards") + "/val_*.bin --set eval.batches=1",
                              &output),
            0)
      << output;
  ASSERT_EQ(test::run_command(mxtrain + " export " + dir.file("run") + " " + dir.file("export"), &output), 0) << output;
  EXPECT_EQ(test::read_file(dir.file("export/tokenizer.json")), test::read_file(tokenizer));
  EXPECT_EQ(test::read_file(dir.file("export/tokenizer_config.json")), test::read_file(dir.file("tok/tokenizer_config.json")));
  EXPECT_FALSE(std::filesystem::exists(dir.file("export/my_bpe.json")));
  // The export is a model directory mxtrain reads back with the same tokenizer.
  ASSERT_EQ(test::run_command(mxtrain + " generate " + dir.file("export") + " --prompt 'The ' --max-tokens 4 -d cpu",
                              &output),
            0)
      << output;
}

TEST(HfRoundTrip, LlamaExportImportExportIsBitIdentical) { expect_round_trip("tiny"); }
TEST(HfRoundTrip, Gpt2ExportImportExportIsBitIdentical) { expect_round_trip("tiny-gpt2"); }
// A Llama with biases on q, k and v is exported as a Qwen2 (q/k/v_proj.bias), one with biases on
// every linear as a Llama with attention_bias and mlp_bias; each comes back the same bits.
TEST(HfRoundTrip, Qwen2ExportImportExportIsBitIdentical) { expect_round_trip("tiny", " --set model.qkv_bias=true"); }
TEST(HfRoundTrip, LlamaWithBiasesExportImportExportIsBitIdentical) {
  expect_round_trip("tiny", " --set model.bias=true");
}

}  // namespace
}  // namespace mxtrain
