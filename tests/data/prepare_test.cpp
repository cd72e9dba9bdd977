// prepare: the split is checked against an independent recomputation (join with "\n", cut into
// 4096-byte blocks, every k-th to validation), then meta.json, re-runs, and every error path.
#include <gtest/gtest.h>

#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "data/data_test_helpers.hpp"
#include "mxtrain/cli/commands.hpp"
#include "mxtrain/data/prepare.hpp"
#include "mxtrain/data/shard.hpp"
#include "support/test_support.hpp"

namespace mxtrain::data {
namespace {

namespace fs = std::filesystem;

std::string pseudo_text(size_t bytes, uint32_t seed) {
  std::string text;
  uint32_t state = seed;
  for (size_t i = 0; i < bytes; ++i) {
    state = state * 1664525u + 1013904223u;
    uint32_t pick = (state >> 24) % 28;
    text.push_back(pick == 26 ? ' ' : pick == 27 ? '\n' : static_cast<char>('a' + pick));
  }
  return text;
}

std::string shard_text(const std::string& path) {
  std::string text;
  for (int32_t token : ShardReader(path).read_all()) text.push_back(static_cast<char>(token));
  return text;
}

std::vector<std::string> directory_names(const std::string& directory) {
  std::vector<std::string> names;
  for (const fs::directory_entry& entry : fs::directory_iterator(directory)) names.push_back(entry.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

struct Corpus {
  test::TempDir dir;
  std::string first = pseudo_text(9000, 1), second = pseudo_text(11000, 2);
  Corpus() {
    data_test::write_text_file(dir.file("first.txt"), first);
    data_test::write_text_file(dir.file("second.txt"), second);
  }
  PrepareOptions options(double val_fraction, int64_t shard_tokens) const {
    PrepareOptions options;
    options.output_dir = dir.file("out");
    options.input_files = {dir.file("first.txt"), dir.file("second.txt")};
    options.val_fraction = val_fraction;
    options.shard_tokens = shard_tokens;
    return options;
  }
};

TEST(Prepare, SplitsEveryKthBlockAndShardsTrain) {
  Corpus corpus;
  PrepareResult result = prepare_corpus(corpus.options(0.25, 5000));

  // Independent recomputation: 20001 bytes, blocks 0..4; k = 4 sends block 3 to validation.
  std::string stream = corpus.first + "\n" + corpus.second;
  ASSERT_EQ(stream.size(), 20001u);
  std::string train, val;
  for (size_t begin = 0, block = 0; begin < stream.size(); begin += 4096, ++block)
    ((block + 1) % 4 == 0 ? val : train) += stream.substr(begin, 4096);
  ASSERT_EQ(val.size(), 4096u);

  const std::string out = corpus.dir.file("out");
  ASSERT_EQ(result.train_shards.size(), 4u);  // 15905 tokens at 5000 per shard
  ASSERT_EQ(result.val_shards.size(), 1u);
  std::string train_read;
  for (size_t i = 0; i < 4; ++i) {
    std::string path = strf("%s/train_%06zu.bin", out.c_str(), i);
    EXPECT_EQ(result.train_shards[i].path, path);
    EXPECT_EQ(result.train_shards[i].tokens, i < 3 ? 5000 : 905);
    EXPECT_EQ(ShardReader(path).version(), 1);
    train_read += shard_text(path);
  }
  EXPECT_EQ(train_read, train);
  EXPECT_EQ(shard_text(out + "/val_000000.bin"), val);
  EXPECT_EQ(directory_names(out), (std::vector<std::string>{"meta.json", "train_000000.bin", "train_000001.bin",
                                                            "train_000002.bin", "train_000003.bin", "val_000000.bin"}));

  nlohmann::json meta = nlohmann::json::parse(data_test::read_text_file(out + "/meta.json"));
  EXPECT_EQ(meta["tokenizer"], "byte");
  EXPECT_EQ(meta["vocab_size"], 256);
  EXPECT_EQ(meta["train_tokens"], 15905);
  EXPECT_EQ(meta["val_tokens"], 4096);
  EXPECT_EQ(meta["block_tokens"], 4096);
  EXPECT_EQ(meta["shard_tokens"], 5000);
  EXPECT_EQ(meta["val_fraction"], 0.25);
  EXPECT_EQ(meta["train_shards"], (std::vector<std::string>{"train_000000.bin", "train_000001.bin",
                                                            "train_000002.bin", "train_000003.bin"}));
  EXPECT_EQ(meta["val_shards"], std::vector<std::string>{"val_000000.bin"});
  ASSERT_EQ(meta["sources"].size(), 2u);
  EXPECT_EQ(meta["sources"][0]["path"], corpus.dir.file("first.txt"));
  EXPECT_EQ(meta["sources"][0]["bytes"], 9000);
  EXPECT_EQ(meta["sources"][1]["path"], corpus.dir.file("second.txt"));
  EXPECT_EQ(meta["sources"][1]["bytes"], 11000);
  CorpusMeta parsed = corpus_meta_from_json(meta, "meta.json");
  EXPECT_EQ(parsed.train_tokens, result.meta.train_tokens);
}

TEST(Prepare, DefaultFractionSendsEveryTwentiethBlock) {
  EXPECT_EQ(validation_block_period(0.05), 20);
  EXPECT_EQ(validation_block_period(0.1), 10);
  EXPECT_EQ(validation_block_period(0.3), 3);
  EXPECT_EQ(validation_block_period(0.5), 2);
  test::TempDir dir;
  std::string text = pseudo_text(20 * 4096 + 10, 3);
  data_test::write_text_file(dir.file("a.txt"), text);
  PrepareOptions options;
  options.output_dir = dir.file("out");
  options.input_files = {dir.file("a.txt")};
  PrepareResult result = prepare_corpus(options);
  EXPECT_EQ(shard_text(dir.file("out/val_000000.bin")), text.substr(19 * 4096, 4096));
  EXPECT_EQ(shard_text(dir.file("out/train_000000.bin")), text.substr(0, 19 * 4096) + text.substr(20 * 4096));
}

TEST(Prepare, RerunOverwritesCleanly) {
  Corpus corpus;
  const std::string out = corpus.dir.file("out");
  prepare_corpus(corpus.options(0.25, 5000));
  data_test::write_text_file(out + "/train_000007.bin.tmp", "left over by a crash");
  data_test::write_text_file(out + "/notes.txt", "not ours");
  PrepareResult second = prepare_corpus(corpus.options(0.5, 100000));
  EXPECT_EQ(second.removed_stale, (std::vector<std::string>{out + "/train_000001.bin", out + "/train_000002.bin",
                                                            out + "/train_000003.bin", out + "/train_000007.bin.tmp"}));
  EXPECT_EQ(directory_names(out),
            (std::vector<std::string>{"meta.json", "notes.txt", "train_000000.bin", "val_000000.bin"}));
  nlohmann::json meta = nlohmann::json::parse(data_test::read_text_file(out + "/meta.json"));
  EXPECT_EQ(meta["train_tokens"], 4096 * 2 + (20001 - 4 * 4096));  // blocks 0, 2, 4
  EXPECT_EQ(meta["val_tokens"], 4096 * 2);                          // blocks 1, 3
  EXPECT_EQ(ShardReader(out + "/train_000000.bin").token_count(), meta["train_tokens"].get<int64_t>());
}

TEST(Prepare, MissingOrUnreadableInputIsNamedAndNothingIsWritten) {
  Corpus corpus;
  PrepareOptions options = corpus.options(0.25, 5000);
  options.input_files.push_back(corpus.dir.file("missing.txt"));
  std::string text = data_test::error_text([&] { prepare_corpus(options); });
  EXPECT_CONTAINS(text, "cannot read input file " + corpus.dir.file("missing.txt"));
  EXPECT_FALSE(fs::exists(corpus.dir.file("out")));

  options.input_files.back() = corpus.dir.path();  // a directory
  text = data_test::error_text([&] { prepare_corpus(options); });
  EXPECT_CONTAINS(text, corpus.dir.path() + ": not a regular file");
}

TEST(Prepare, TooSmallForValidationAndBadOptions) {
  Corpus corpus;
  PrepareOptions options = corpus.options(0.05, 5000);  // 5 blocks < 20
  std::string text = data_test::error_text([&] { prepare_corpus(options); });
  EXPECT_CONTAINS(text, "20,001 tokens, too few for a validation block");
  EXPECT_CONTAINS(text, "more than 77,824 tokens");
  EXPECT_CONTAINS(text, "raise --val-fraction");
  EXPECT_FALSE(fs::exists(corpus.dir.file("out/train_000000.bin")));
  EXPECT_FALSE(fs::exists(corpus.dir.file("out/train_000000.bin.tmp")));

  options.val_fraction = 0;
  EXPECT_CONTAINS(data_test::error_text([&] { prepare_corpus(options); }, ErrorKind::config), "outside (0, 0.5]");
  options.val_fraction = 0.25;
  options.shard_tokens = int64_t{1} << 31;
  EXPECT_CONTAINS(data_test::error_text([&] { prepare_corpus(options); }, ErrorKind::config), "--shard-tokens");
  options.shard_tokens = 5000;
  options.tokenizer = "gpt2";
  EXPECT_CONTAINS(data_test::error_text([&] { prepare_corpus(options); }, ErrorKind::config), "unknown tokenizer");
}

// ---- the subcommand ------------------------------------------------------------------------------

void parse(CLI::App& app, std::vector<std::string> arguments) {
  arguments.insert(arguments.begin(), "mxtrain");
  std::vector<const char*> argv;
  for (const std::string& argument : arguments) argv.push_back(argument.c_str());
  app.parse(static_cast<int>(argv.size()), argv.data());
}

TEST(PrepareCommand, WritesAndReportsShards) {
  Corpus corpus;
  CLI::App app;
  cli::add_prepare_command(app);
  testing::internal::CaptureStdout();
  parse(app, {"prepare", "--output", corpus.dir.file("out"), "--val-fraction", "0.25", "--shard-tokens", "5000",
              corpus.dir.file("first.txt"), corpus.dir.file("second.txt")});
  std::string printed = testing::internal::GetCapturedStdout();
  EXPECT_CONTAINS(printed, "2 files, 20,000 bytes, 2 documents, tokenizer byte (vocab 256)");
  EXPECT_CONTAINS(printed, "wrote " + corpus.dir.file("out/train_000003.bin"));
  EXPECT_CONTAINS(printed, "905 tokens");
  EXPECT_CONTAINS(printed, "wrote " + corpus.dir.file("out/val_000000.bin"));
  EXPECT_CONTAINS(printed, "train 15,905 tokens, validation 4,096 tokens");
  EXPECT_EQ(ShardReader(corpus.dir.file("out/val_000000.bin")).token_count(), 4096);
}

TEST(PrepareCommand, HelpDocumentsEveryOptionWithDefaults) {
  CLI::App app;
  cli::add_prepare_command(app);
  CLI::App* command = app.get_subcommand("prepare");
  std::string help = command->help();
  for (const char* expected : {"--output", "--val-fraction", "--shard-tokens", "--tokenizer", "FILE", "0.05",
                               "100000000", "byte", "4096"})
    EXPECT_CONTAINS(help, expected);
  for (const CLI::Option* option : command->get_options()) {
    if (option->get_name() == "--help") continue;
    EXPECT_FALSE(option->get_description().empty()) << option->get_name();
  }
}

TEST(PrepareCommand, RejectsBadValuesAndMissingArguments) {
  Corpus corpus;
  std::string file = corpus.dir.file("first.txt"), out = corpus.dir.file("out");
  const std::vector<std::vector<std::string>> bad = {
      {"prepare", "--output", out, "--val-fraction", "0.7", file},
      {"prepare", "--output", out, "--val-fraction", "0", file},
      {"prepare", "--output", out, "--shard-tokens", "0", file},
      {"prepare", "--output", out, "--tokenizer", "gpt2", file},
      {"prepare", "--output", out},
      {"prepare", file},
      {"prepare", "--output", out, "--bogus", file},
  };
  for (const std::vector<std::string>& arguments : bad) {
    CLI::App app;
    app.allow_extras(false);
    cli::add_prepare_command(app);
    EXPECT_THROW(parse(app, arguments), CLI::ParseError) << arguments.back();
  }
  EXPECT_FALSE(fs::exists(out));
}

}  // namespace
}  // namespace mxtrain::data
