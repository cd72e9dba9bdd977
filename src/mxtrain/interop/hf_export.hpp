// mxtrain weights → a Hugging Face model directory that `transformers` loads with
// from_pretrained: config.json, generation_config.json, model.safetensors (or shards of at most
// max_shard_bytes with model.safetensors.index.json), and the tokenizer's files when the run used
// a Hugging Face or sentencepiece tokenizer. The inverse of hf_checkpoint.hpp's mapping: q/k/v
// and gate/up rows split apart, GPT-2's Conv1D weights transposed, the vocabulary padding sliced
// off, no lm_head key when the embeddings are tied.
//
// Everything is written into OUT.partial and renamed onto OUT at the end: an interrupted export
// leaves no directory that looks complete. OUT must not exist or be an empty directory.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mxtrain/core/dtype.hpp"
#include "mxtrain/model/config.hpp"
#include "mxtrain/model/layout.hpp"

namespace mxtrain::interop {

struct HfExportOptions {
  DType dtype = DType::bf16;                 // bf16 or f32
  uint64_t max_shard_bytes = 5'000'000'000;  // transformers' default shard size
  int bos_token_id = 0, eos_token_id = 0;
  std::string tokenizer;                     // data.tokenizer of the run: its files are copied ("byte": none)
};

struct HfExportResult {
  std::vector<std::string> files;  // written, relative to the output directory
  uint64_t tensor_bytes = 0;
  int64_t tensors = 0;
};

HfExportResult export_hf(const ModelConfig& config, const ParameterValues& values, const std::string& out_dir,
                         const HfExportOptions& options);

}  // namespace mxtrain::interop
