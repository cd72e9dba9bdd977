// The training loop end to end on the CPU: an interrupted and resumed run continues with the
// identical loss sequence; a corrupt newest checkpoint falls back to the previous one; the run
// directory's checkpoints are never overwritten by a fresh run; eval.batches = 0 skips evaluation.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/train/stop_signal.hpp"
#include "mxtrain/train/trainer.hpp"
#include "data/data_test_helpers.hpp"
#include "support/test_support.hpp"
#include "support/training_test.hpp"

namespace mxtrain {
namespace {

RunConfig tiny_run(const std::string& corpus, const std::string& run_dir, int64_t steps) {
  return test::tiny_training_run(corpus, run_dir, steps);
}

// step -> loss from the run's metrics.jsonl (the last line for a step wins).
std::map<int64_t, double> losses(const std::string& run_dir) {
  std::map<int64_t, double> result;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) result[record["step"].get<int64_t>()] = record["loss"].get<double>();
  }
  return result;
}

class TrainerTest : public test::TrainingTest {};

TEST_F(TrainerTest, InterruptedRunResumesWithTheIdenticalLossSequence) {
  const int64_t steps = 7;
  TrainerSummary full = Trainer(tiny_run(corpus_, dir_.file("full"), steps), {}).run();
  EXPECT_EQ(full.steps_done, steps);

  // A stop request before the run: the trainer finishes step 1, saves and returns.
  request_stop_for_test(15);
  TrainerSummary first = Trainer(tiny_run(corpus_, dir_.file("split"), steps), {}).run();
  EXPECT_TRUE(first.stopped_by_signal);
  EXPECT_EQ(first.steps_done, 1);
  clear_stop_request();
  TrainerSummary second = Trainer(tiny_run(corpus_, dir_.file("split"), steps), {}).run();
  EXPECT_EQ(second.steps_done, steps);

  std::map<int64_t, double> expected = losses(dir_.file("full"));
  std::map<int64_t, double> resumed = losses(dir_.file("split"));
  ASSERT_EQ(expected.size(), static_cast<size_t>(steps));
  ASSERT_EQ(resumed.size(), static_cast<size_t>(steps));
  for (int64_t step = 1; step <= steps; ++step) EXPECT_EQ(expected[step], resumed[step]) << "step " << step;
  EXPECT_LT(expected[steps], expected[1]) << "the loss did not fall";
  EXPECT_EQ(full.final_val_loss, second.final_val_loss);
}

// A finished run run again resumes at its last step and trains nothing: it reports the held-out
// loss again but records no line of metrics.jsonl twice (it used to repeat the final val_loss).
TEST_F(TrainerTest, RunningAFinishedRunAgainRepeatsNoRecord) {
  const std::string run_dir = dir_.file("run");
  const TrainerSummary first = Trainer(tiny_run(corpus_, run_dir, 4), {}).run();
  const TrainerSummary again = Trainer(tiny_run(corpus_, run_dir, 4), {}).run();
  EXPECT_EQ(again.steps_done, 4);
  EXPECT_EQ(again.final_val_loss, first.final_val_loss);
  std::map<std::pair<int64_t, std::string>, int> counts;
  std::ifstream in(run_dir + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json record = nlohmann::json::parse(line);
    for (const char* key : {"loss", "val_loss", "sample"})
      if (record.contains(key)) ++counts[{record["step"].get<int64_t>(), key}];
  }
  EXPECT_EQ((counts[{4, "val_loss"}]), 1);
  for (const auto& [what, count] : counts) EXPECT_EQ(count, 1) << what.second << " at step " << what.first;
}

TEST_F(TrainerTest, CorruptNewestCheckpointFallsBackToThePreviousOne) {
  const std::string run_dir = dir_.file("run");
  Trainer(tiny_run(corpus_, run_dir, 6), {}).run();  // checkpoints at 3 and 6
  const std::string newest = run_dir + "/checkpoints/step_00000006/rank_00000.bin";
  ASSERT_TRUE(std::filesystem::exists(newest));
  {
    std::fstream file(newest, std::ios::in | std::ios::out | std::ios::binary);
    file.seekp(100);
    char byte = 0x5a;
    file.write(&byte, 1);
  }
  // Extending the run to 8 steps must resume from step 3 (the valid one) and redo 4..8.
  RunConfig config = tiny_run(corpus_, run_dir, 8);
  TrainerSummary summary = Trainer(config, {}).run();
  EXPECT_EQ(summary.steps_done, 8);
  std::map<int64_t, double> history = losses(run_dir);
  EXPECT_EQ(history.size(), 8u);
}

TEST_F(TrainerTest, FreshRunRefusesADirectoryWithCheckpoints) {
  const std::string run_dir = dir_.file("run");
  Trainer(tiny_run(corpus_, run_dir, 3), {}).run();
  RunConfig config = tiny_run(corpus_, run_dir, 3);
  config.checkpoint.resume = "never";
  try {
    Trainer(config, {}).run();
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::checkpoint);
    EXPECT_NE(error.full_message().find("already has checkpoints"), std::string::npos);
  }
}

TEST_F(TrainerTest, ResumeWithADifferentModelIsRefused) {
  const std::string run_dir = dir_.file("run");
  Trainer(tiny_run(corpus_, run_dir, 3), {}).run();
  RunConfig config = tiny_run(corpus_, run_dir, 4);
  config.model.ffn_hidden = 96;
  try {
    Trainer(config, {}).run();
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_NE(error.full_message().find("model.ffn_hidden"), std::string::npos) << error.full_message();
  }
}

TEST_F(TrainerTest, MissingDataNamesThePatternAndTheFix) {
  RunConfig config = tiny_run(corpus_, dir_.file("run"), 3);
  config.data.train = dir_.file("nowhere") + "/train_*.bin";
  try {
    Trainer(config, {}).run();
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::data);
    EXPECT_NE(error.full_message().find("nowhere"), std::string::npos) << error.full_message();
    EXPECT_NE(error.full_message().find("setup"), std::string::npos) << error.full_message();
  }
}

// data.tokenizer is loaded and checked before the first step: a missing file, one that is not
// the tokenizer that made the shards (their meta.json), or, with samples on, one larger than the
// model's vocabulary stops the run at start-up, not at the first sample or the final export.
TEST_F(TrainerTest, AWrongTokenizerStopsTheRunAtStartUp) {
  const std::string bpe300 = test::source_dir() + "/tests/fuzz/corpus/tokenizer/bpe300.json";
  auto start_error = [&](const std::vector<std::pair<std::string, std::string>>& settings) {
    RunConfig config = test::tiny_training_run(corpus_, dir_.file("run"), 3, settings);
    try {
      Trainer(config, {}).run();
    } catch (const Error& error) {
      EXPECT_FALSE(std::filesystem::exists(dir_.file("run") + "/metrics.jsonl")) << "a step ran first";
      return error.full_message();
    }
    return std::string();
  };
  EXPECT_CONTAINS(start_error({{"data.tokenizer", dir_.file("missing/tokenizer.json")}}),
                  "data.tokenizer: tokenizer '" + dir_.file("missing/tokenizer.json") + "' does not exist");
  // The held-out shards are checked too: here their meta.json says another tokenizer made them.
  const std::string other = dir_.file("other");
  std::filesystem::copy(corpus_, other);
  nlohmann::json meta = nlohmann::json::parse(test::read_file(other + "/meta.json"));
  meta["tokenizer"] = bpe300;
  meta["vocab_size"] = 300;
  std::ofstream(other + "/meta.json") << meta.dump();
  EXPECT_CONTAINS(start_error({{"data.val", other + "/val_*.bin"}}),
                  "data.tokenizer is 'byte' (256 tokens), but the shards in " + other + " were made by '" + bpe300 +
                      "' (300 tokens, per its meta.json)");
#if MXTRAIN_HAVE_PCRE2
  const std::string mismatch = start_error({{"data.tokenizer", bpe300}});
  EXPECT_CONTAINS(mismatch, "data.tokenizer is '" + bpe300 + "' (300 tokens), but the shards in " + corpus_ +
                                " were made by 'byte' (256 tokens, per its meta.json)");
  EXPECT_CONTAINS(mismatch, "fix: set data.tokenizer = 'byte'");
  // No meta.json: nothing to compare with, but samples need the model to hold every id.
  std::filesystem::remove(corpus_ + "/meta.json");
  EXPECT_CONTAINS(start_error({{"data.tokenizer", bpe300}, {"log.sample_every", "2"}}),
                  "has 300 tokens, more than model.vocab_size = 256");
  EXPECT_EQ(start_error({{"data.tokenizer", bpe300}, {"log.sample_every", "0"}}), "");
#endif
}

// A Hugging Face model directory with its own tokenizer, continued on byte-tokenized shards: the
// model would read bytes as its token ids, so the run is refused before its first step.
TEST_F(TrainerTest, AModelWithItsOwnTokenizerRefusesByteShards) {
#if MXTRAIN_HAVE_PCRE2
  const std::string model = dir_.file("model");
  std::filesystem::copy(test::source_dir() + "/tests/reference/hf/llama_gqa_tied", model);
  std::filesystem::copy_file(test::source_dir() + "/tests/fuzz/corpus/tokenizer/bpe300.json", model + "/tokenizer.json");
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = {{"model.init_from", model},          {"train.seq_len", "32"},
                       {"train.micro_batch_size", "2"},     {"train.global_batch_size", "2"},
                       {"train.steps", "1"},                {"train.device", "cpu"},
                       {"checkpoint.dir", dir_.file("run")}, {"data.train", corpus_ + "/train_*.bin"},
                       {"data.val", corpus_ + "/val_*.bin"}};
  RunConfig config = load_config(sources);
  try {
    Trainer(config, {}).run();
    FAIL() << "expected an error";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::config);
    EXPECT_CONTAINS(error.full_message(), "model.init_from's model comes with its tokenizer (" + model +
                                              "/tokenizer.json, 300 tokens), but data.tokenizer is 'byte'");
    EXPECT_CONTAINS(error.full_message(), "mxtrain prepare --tokenizer " + model);
  }
  EXPECT_FALSE(std::filesystem::exists(dir_.file("run") + "/metrics.jsonl"));
#else
  GTEST_SKIP() << "built without PCRE2";
#endif
}

// eval.batches = 0 means no held-out evaluation: no val_loss record (once NaN, written as null)
// and no held-out loss in the summary.
TEST_F(TrainerTest, ZeroEvalBatchesSkipsTheHeldOutEvaluation) {
  RunConfig config = tiny_run(corpus_, dir_.file("run"), 4);
  config.eval.batches = 0;
  const TrainerSummary summary = Trainer(config, {}).run();
  EXPECT_EQ(summary.steps_done, 4);
  EXPECT_LT(summary.final_val_loss, 0);
  std::ifstream in(dir_.file("run") + "/metrics.jsonl");
  int records = 0;
  for (std::string line; std::getline(in, line);) {
    EXPECT_EQ(line.find("val_loss"), std::string::npos) << line;
    EXPECT_EQ(line.find("null"), std::string::npos) << line;
    if (line.find("\"event\"") == std::string::npos) ++records;  // the run report's events aside
  }
  EXPECT_EQ(records, 4);
}

}  // namespace
}  // namespace mxtrain
