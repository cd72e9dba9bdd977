// `mxtrain prepare`: text files → token shards for training. One option table; the work is
// data::prepare_corpus, this file only parses and reports what was written.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>

#include "mxtrain/cli/commands.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/data/prepare.hpp"
#include "mxtrain/data/tokenizer.hpp"

namespace mxtrain::cli {
namespace {

void print_result(const data::PrepareOptions& options, const data::PrepareResult& result) {
  int64_t source_bytes = 0;
  for (const data::SourceFile& source : result.meta.sources) source_bytes += source.bytes;
  std::printf("prepare: %zu file%s, %s bytes, tokenizer %s (vocab %s), 1 block in %lld (of %lld tokens) to "
              "validation\n",
              result.meta.sources.size(), result.meta.sources.size() == 1 ? "" : "s",
              log::with_commas(static_cast<double>(source_bytes)).c_str(), result.meta.tokenizer.c_str(),
              log::with_commas(static_cast<double>(result.meta.vocab_size)).c_str(),
              static_cast<long long>(data::validation_block_period(options.val_fraction)),
              static_cast<long long>(data::kSplitBlockTokens));
  size_t width = 0;
  for (const auto* shards : {&result.train_shards, &result.val_shards})
    for (const data::WrittenShard& shard : *shards) width = std::max(width, shard.path.size());
  for (const auto* shards : {&result.train_shards, &result.val_shards}) {
    for (const data::WrittenShard& shard : *shards) {
      std::printf("wrote %-*s %14s tokens\n", static_cast<int>(width), shard.path.c_str(),
                  log::with_commas(static_cast<double>(shard.tokens)).c_str());
    }
  }
  std::printf("wrote %s (train %s tokens, validation %s tokens)\n", result.meta_path.c_str(),
              log::with_commas(static_cast<double>(result.meta.train_tokens)).c_str(),
              log::with_commas(static_cast<double>(result.meta.val_tokens)).c_str());
  for (const std::string& path : result.removed_stale) std::printf("removed %s (left by an earlier run)\n", path.c_str());
  std::fflush(stdout);
}

std::string validation_fraction_check(const std::string& text) {
  try {
    size_t used = 0;
    double value = std::stod(text, &used);
    if (used == text.size() && value > 0 && value <= 0.5) return {};
  } catch (const std::exception&) {
  }
  return "must be a number in (0, 0.5], e.g. 0.05";
}

}  // namespace

void add_prepare_command(CLI::App& app) {
  auto options = std::make_shared<data::PrepareOptions>();
  CLI::App* command = app.add_subcommand(
      "prepare", "Tokenize text files into train/validation token shards (llm.c's .bin format) and meta.json");
  command->footer(
      "The files, joined by newlines, form one token stream cut into blocks of 4096 tokens; every\n"
      "round(1/val-fraction)-th block goes to validation. Writes DIR/train_000000.bin, ...,\n"
      "DIR/val_000000.bin, ... and DIR/meta.json; re-running over DIR replaces them.\n"
      "Example: mxtrain prepare --output data/mycorpus notes/*.txt");
  command->add_option("-o,--output", options->output_dir, "Directory for the shards and meta.json (created if missing)")
      ->required()
      ->type_name("DIR");
  command->add_option("--val-fraction", options->val_fraction,
                      "Share of the token stream held out for validation, in (0, 0.5]")
      ->capture_default_str()
      ->type_name("FRACTION")
      ->check(CLI::Validator(validation_fraction_check, "(0, 0.5]", "FRACTION"));
  command->add_option("--shard-tokens", options->shard_tokens, "Most tokens per shard file; a split with more tokens continues in the next file")
      ->capture_default_str()
      ->type_name("N")
      ->check(CLI::Range(int64_t{1}, int64_t{std::numeric_limits<int32_t>::max()}));
  command->add_option("--tokenizer", options->tokenizer,
                      "Tokenizer: byte (vocab 256, one token per byte, lossless on any text)")
      ->capture_default_str()
      ->type_name("NAME")
      ->check(CLI::IsMember(data::tokenizer_names()));
  command->add_option("files", options->input_files, "Text files to tokenize, in this order")
      ->required()
      ->type_name("FILE");
  command->callback([options]() {
    data::PrepareResult result = data::prepare_corpus(*options);
    print_result(*options, result);
  });
}

}  // namespace mxtrain::cli
