// `mxtrain prepare`: documents (text files, .jsonl, .jsonl.zst: data/documents.hpp) → train and
// validation token shards + meta.json. Documents are tokenized on every core; between two
// documents goes the tokenizer's end-of-document token (EOS), or a newline's tokens where the
// tokenizer has none (the byte tokenizer). The split is deterministic and independent of file
// boundaries: the documents form one token stream cut into blocks of 4096 tokens, and every k-th block (k =
// round(1 / val_fraction); blocks k-1, 2k-1, ... counting from 0) goes to validation. Nothing at
// the output appears before everything was tokenized and written: shards are renamed into place
// at the end, then meta.json, then shards of an earlier run that this one did not rewrite are removed.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mxtrain/data/corpus_meta.hpp"

namespace mxtrain::data {

constexpr int64_t kSplitBlockTokens = 4096;

struct PrepareOptions {
  std::string output_dir;
  std::vector<std::string> input_files;
  double val_fraction = 0.05;          // in (0, 0.5]
  int64_t shard_tokens = 100'000'000;  // most tokens per shard file, at most 2^31 - 1
  std::string tokenizer = "byte";      // see data::make_tokenizer
  std::string field = "text";          // the JSON field that holds a .jsonl line's text
  int threads = 0;                     // tokenizing threads; 0 = every core
};

struct WrittenShard {
  std::string path;
  int64_t tokens = 0;
};

struct PrepareResult {
  std::vector<WrittenShard> train_shards;  // DIR/train_000000.bin, ...
  std::vector<WrittenShard> val_shards;    // DIR/val_000000.bin, ...
  std::vector<std::string> removed_stale;  // shards of an earlier run that were deleted
  std::string meta_path;                   // DIR/meta.json
  int64_t documents = 0;
  CorpusMeta meta;
};

// k of the split: every k-th block goes to validation. Throws Error(config) for a fraction
// outside (0, 0.5].
int64_t validation_block_period(double val_fraction);

// Throws Error(data) naming a missing or unreadable input and Error(config) for bad options,
// both before anything is written; Error(data) when the corpus is too small to give validation
// a block.
PrepareResult prepare_corpus(const PrepareOptions& options);

}  // namespace mxtrain::data
