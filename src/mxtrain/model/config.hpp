// Model shapes as data: one struct, presets derived from it by name, every field overridable
// from the run config (config/run_config.cpp visits the same fields).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "mxtrain/backend/rope_spec.hpp"

namespace mxtrain {

enum class ModelFamily : uint8_t {
  llama,  // RMSNorm, RoPE, SwiGLU, grouped-query attention, no bias, untied head
  gpt2,   // LayerNorm, learned positions, GELU (tanh), bias, tied head
};
const char* family_name(ModelFamily family);

struct ModelConfig {
  std::string preset = "tiny";
  ModelFamily family = ModelFamily::llama;
  int64_t vocab_size = 256;     // tokens the tokenizer produces
  int64_t padded_vocab = 256;   // rows of the embedding and head; multiple of 64 for fast GEMMs
  int64_t hidden = 256;
  int64_t layers = 4;
  int64_t heads = 4;
  int64_t kv_heads = 4;
  int64_t ffn_hidden = 704;     // SwiGLU inner size (gate and up each); GELU MLP inner size
  int64_t max_seq_len = 1024;   // size of the learned position table (gpt2)
  // A Mistral checkpoint's sliding attention window (0 = none). mxtrain's attention is full
  // causal, which equals the window's exactly on sequences of at most this many tokens: longer
  // training sequences are refused (validate(RunConfig)), and generation keeps to it.
  int64_t sliding_window = 0;
  float norm_eps = 1e-5f;
  float rope_theta = 10000.0f;
  // Llama 3's RoPE frequency scaling (rope_scaling_factor 0 = none); backend.hpp RopeSpec.
  float rope_scaling_factor = 0.0f;
  float rope_low_freq_factor = 1.0f, rope_high_freq_factor = 4.0f;
  int64_t rope_original_max_positions = 0;
  float init_std = 0.02f;
  bool tied_embeddings = false;
  bool bias = false;  // biases in every linear layer (GPT-2; a Llama with attention_bias and mlp_bias)
  // Biases on the query, key and value projections only (Qwen2); implied by bias.
  bool qkv_bias = false;
  // A Hugging Face model directory this model starts from ("" = random initialisation): its
  // config.json sets the shape (interop::apply_init_from), its safetensors the weights.
  std::string init_from;

  int64_t head_dim() const { return hidden / heads; }
  // The most tokens the model attends over as it was trained: max_seq_len, or the sliding window.
  int64_t attention_context() const {
    return sliding_window > 0 && sliding_window < max_seq_len ? sliding_window : max_seq_len;
  }
  RopeSpec rope() const {
    RopeSpec spec(rope_theta);
    spec.scaling_factor = rope_scaling_factor;
    spec.low_freq_factor = rope_low_freq_factor;
    spec.high_freq_factor = rope_high_freq_factor;
    spec.original_max_positions = rope_original_max_positions;
    return spec;
  }
  bool has_qkv_bias() const { return bias || qkv_bias; }
  int64_t qkv_cols() const { return (heads + 2 * kv_heads) * head_dim(); }
  int64_t up_cols() const { return family == ModelFamily::llama ? 2 * ffn_hidden : ffn_hidden; }
  // Every parameter, counted once (a tied head is not counted twice).
  int64_t parameter_count() const;
  // Parameters without the input embedding tables (PaLM's N for 6N + 12·L·d·T).
  int64_t non_embedding_parameter_count() const;
  // Model FLOPs per token of one training step, PaLM's convention (no recompute counted).
  double training_flops_per_token(int64_t seq_len) const;
  // Throws Error(config) naming the field and the rule when a shape is inconsistent.
  void validate() const;
};

std::vector<std::string> model_preset_names();
// Throws Error(config) listing the presets when the name is unknown.
ModelConfig model_preset(const std::string& name);

}  // namespace mxtrain
