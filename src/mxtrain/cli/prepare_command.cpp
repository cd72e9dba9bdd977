// `mxtrain prepare`: text files → token shards for training. One option table; the work is
// data::prepare_corpus, this file only parses and reports what was written.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <filesystem>
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
  std::printf("prepare: %zu file%s, %s bytes, %s document%s, tokenizer %s (vocab %s), 1 block in %lld (of %lld "
              "tokens) to validation\n",
              result.meta.sources.size(), result.meta.sources.size() == 1 ? "" : "s",
              log::with_commas(static_cast<double>(source_bytes)).c_str(),
              log::with_commas(static_cast<double>(result.documents)).c_str(), result.documents == 1 ? "" : "s",
              result.meta.tokenizer.c_str(),
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

// "byte" or a file or directory that exists; what it holds is checked when it loads.
std::string tokenizer_check(const std::string& text) {
  if (text == "byte") return {};
  std::error_code error;
  if (std::filesystem::exists(text, error)) return {};
  return "must be byte, or a tokenizer.json, a sentencepiece .model file or a model directory that exists";
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
      "The documents, separated by the tokenizer's end-of-document token (a newline for byte), form\n"
      "one token stream cut into blocks of 4096 tokens; every round(1/val-fraction)-th block goes\n"
      "to validation. Writes DIR/train_000000.bin, ..., DIR/val_000000.bin, ... and DIR/meta.json;\n"
      "re-running over DIR replaces them. Parquet: convert with scripts/parquet_to_jsonl.py first.\n"
      "Examples: mxtrain prepare --output data/mycorpus notes/*.txt\n"
      "          mxtrain prepare --output data/web --tokenizer models/Llama-3.2-1B web-*.jsonl.zst");
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
                      "byte (vocab 256, one token per byte), a Hugging Face tokenizer.json (byte-level BPE), a "
                      "sentencepiece .model file, or a model directory holding one of them")
      ->capture_default_str()
      ->type_name("NAME|PATH")
      ->check(CLI::Validator(tokenizer_check, "byte|PATH", "TOKENIZER"));
  command->add_option("--field", options->field, "The JSON field that holds the text of a .jsonl / .jsonl.zst line")
      ->capture_default_str()
      ->type_name("NAME");
  command->add_option("--threads", options->threads, "Tokenizing threads (0: every core)")
      ->capture_default_str()
      ->type_name("N")
      ->check(CLI::Range(0, 4096));
  command->add_option("files", options->input_files,
                      "Inputs in this order: text files (one document each), .jsonl or .jsonl.zst (one document a line)")
      ->required()
      ->type_name("FILE");
  command->callback([options]() {
    data::PrepareResult result = data::prepare_corpus(*options);
    print_result(*options, result);
  });
}

}  // namespace mxtrain::cli
