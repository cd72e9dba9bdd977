#include "mxtrain/model/config.hpp"

#include "mxtrain/core/checked.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain {

const char* family_name(ModelFamily family) { return family == ModelFamily::llama ? "llama" : "gpt2"; }

int64_t ModelConfig::parameter_count() const {
  // Checked: the dimensions come from the user, and a wrapped count would be printed as a fact.
  const char* what = "the parameter count";
  const int64_t qkv = checked_mul(checked_add(heads, checked_mul(2, kv_heads, what), what), head_dim(), what);
  const int64_t up = family == ModelFamily::llama ? checked_mul(2, ffn_hidden, what) : ffn_hidden;
  int64_t per_layer = checked_mul(hidden, qkv, what);
  per_layer = checked_add(per_layer, checked_mul(hidden, hidden, what), what);
  per_layer = checked_add(per_layer, checked_mul(hidden, up, what), what);
  per_layer = checked_add(per_layer, checked_mul(ffn_hidden, hidden, what), what);
  int64_t norms_per_layer = checked_mul(2, hidden, what);
  if (bias) per_layer = checked_add(per_layer, qkv + hidden + up + hidden, what);  // each term is below 2^62
  else if (qkv_bias) per_layer = checked_add(per_layer, qkv, what);
  if (family == ModelFamily::gpt2) norms_per_layer *= 2;  // LayerNorm has a bias
  int64_t total = checked_mul(layers, checked_add(per_layer, norms_per_layer, what), what);
  const int64_t embedding = checked_mul(padded_vocab, hidden, what);
  total = checked_add(total, embedding, what);                                        // token embedding
  if (family == ModelFamily::gpt2) total = checked_add(total, checked_mul(max_seq_len, hidden, what), what);  // positions
  total = checked_add(total, family == ModelFamily::gpt2 ? 2 * hidden : hidden, what);  // final norm
  if (!tied_embeddings) total = checked_add(total, embedding, what);                  // head
  return total;
}

int64_t ModelConfig::non_embedding_parameter_count() const {
  // parameter_count() checked every product below, so these cannot overflow.
  int64_t embeddings = padded_vocab * hidden + (family == ModelFamily::gpt2 ? max_seq_len * hidden : 0);
  int64_t count = parameter_count() - embeddings;
  // A tied head's matrix is used as the output projection: PaLM counts it there.
  if (tied_embeddings) count += padded_vocab * hidden;
  return count;
}

double ModelConfig::training_flops_per_token(int64_t seq_len) const {
  return 6.0 * static_cast<double>(non_embedding_parameter_count()) +
         12.0 * static_cast<double>(layers) * static_cast<double>(hidden) * static_cast<double>(seq_len);
}

void ModelConfig::validate() const {
  auto fail = [](const std::string& what, const std::string& fix) { throw Error(ErrorKind::config, what, fix); };
  if (hidden <= 0 || layers <= 0 || heads <= 0 || kv_heads <= 0 || ffn_hidden <= 0 || vocab_size <= 0)
    fail("model dimensions must be positive", "set model.hidden, model.layers, model.heads, model.kv_heads, "
                                              "model.ffn_hidden and model.vocab_size to positive integers");
  if (rope_scaling_factor > 0 && (rope_original_max_positions <= 0 || rope_high_freq_factor <= rope_low_freq_factor ||
                                  rope_low_freq_factor <= 0))
    fail("model.rope_scaling_factor is set but the llama3 scaling's other keys are not consistent",
         "set model.rope_original_max_positions > 0 and 0 < model.rope_low_freq_factor < model.rope_high_freq_factor");
  if (hidden % heads != 0)
    fail(strf("model.hidden = %lld is not divisible by model.heads = %lld", static_cast<long long>(hidden),
              static_cast<long long>(heads)),
         "choose model.heads so that hidden / heads is the head dimension (e.g. 64 or 128)");
  if (heads % kv_heads != 0)
    fail(strf("model.heads = %lld is not a multiple of model.kv_heads = %lld", static_cast<long long>(heads),
              static_cast<long long>(kv_heads)),
         "grouped-query attention shares each KV head among heads / kv_heads query heads; pick a divisor");
  if (head_dim() % 2 != 0) fail("the head dimension must be even for rotary embeddings", "change model.heads");
  if (padded_vocab < vocab_size)
    fail(strf("model.padded_vocab = %lld is smaller than model.vocab_size = %lld",
              static_cast<long long>(padded_vocab), static_cast<long long>(vocab_size)),
         "set model.padded_vocab >= model.vocab_size (a multiple of 64 is fastest)");
  if (family == ModelFamily::gpt2 && kv_heads != heads)
    fail("the gpt2 family uses full multi-head attention", "set model.kv_heads equal to model.heads");
  if (max_seq_len <= 0) fail("model.max_seq_len must be positive", "set model.max_seq_len");
  parameter_count();  // throws Error(config) when the dimensions overflow the count
}

namespace {

ModelConfig gpt2(const std::string& name, int64_t hidden, int64_t layers, int64_t heads) {
  ModelConfig config;
  config.preset = name;
  config.family = ModelFamily::gpt2;
  config.vocab_size = 50257;
  config.padded_vocab = 50304;
  config.hidden = hidden;
  config.layers = layers;
  config.heads = heads;
  config.kv_heads = heads;
  config.ffn_hidden = 4 * hidden;
  config.max_seq_len = 1024;
  config.tied_embeddings = true;
  config.bias = true;
  return config;
}

ModelConfig llama(const std::string& name, int64_t hidden, int64_t layers, int64_t heads, int64_t kv_heads,
                  int64_t ffn, int64_t vocab, float theta) {
  ModelConfig config;
  config.preset = name;
  config.family = ModelFamily::llama;
  config.vocab_size = vocab;
  config.padded_vocab = (vocab + 63) / 64 * 64;
  config.hidden = hidden;
  config.layers = layers;
  config.heads = heads;
  config.kv_heads = kv_heads;
  config.ffn_hidden = ffn;
  config.max_seq_len = 8192;
  config.rope_theta = theta;
  return config;
}

}  // namespace

std::vector<std::string> model_preset_names() {
  return {"tiny",     "tiny-gpt2", "gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1.5b", "llama-1b",
          "llama-3b", "llama-8b",  "llama-14b", "llama-32b", "llama-64b", "te-fsdp"};
}

ModelConfig model_preset(const std::string& name) {
  // A model imported from Hugging Face: the shape comes key by key (interop/hf_checkpoint.cpp);
  // the name only labels the family it came from.
  if (name == "hf-llama" || name == "hf-mistral" || name == "hf-qwen2") {
    ModelConfig config = llama(name, 256, 4, 4, 2, 704, 256, 10000.0f);
    return config;
  }
  if (name == "hf-gpt2") {
    ModelConfig config = gpt2(name, 256, 4, 4);
    config.vocab_size = config.padded_vocab = 256;
    return config;
  }
  // The embedded default: a byte-level Llama of about 3M parameters that trains on two CPU cores.
  if (name == "tiny") return llama("tiny", 256, 4, 4, 2, 704, 256, 10000.0f);
  if (name == "tiny-gpt2") {
    ModelConfig config = gpt2("tiny-gpt2", 256, 4, 4);
    config.vocab_size = 256;
    config.padded_vocab = 256;
    config.max_seq_len = 512;
    return config;
  }
  if (name == "gpt2-124m") return gpt2(name, 768, 12, 12);
  if (name == "gpt2-350m") return gpt2(name, 1024, 24, 16);
  if (name == "gpt2-774m") return gpt2(name, 1280, 36, 20);
  if (name == "gpt2-1.5b") return gpt2(name, 1600, 48, 25);
  if (name == "llama-1b") {
    ModelConfig config = llama(name, 2048, 22, 32, 4, 5632, 32000, 10000.0f);
    config.max_seq_len = 2048;
    return config;
  }
  if (name == "llama-3b") return llama(name, 3072, 28, 24, 8, 8192, 128256, 500000.0f);
  if (name == "llama-8b") return llama(name, 4096, 32, 32, 8, 14336, 128256, 500000.0f);
  if (name == "llama-14b") return llama(name, 5120, 48, 40, 8, 13824, 128256, 500000.0f);
  if (name == "llama-32b") return llama(name, 5120, 64, 40, 8, 27648, 152064, 1000000.0f);
  if (name == "llama-64b") return llama(name, 8192, 72, 64, 8, 28672, 128256, 500000.0f);
  if (name == "te-fsdp") {
    // TransformerEngine's FSDP example layer (LayerNorm, GELU, bias, FFN 3x hidden), 10 layers,
    // with a 32k embedding and tied head added so it trains on tokens.
    ModelConfig config = gpt2(name, 2048, 10, 16);
    config.vocab_size = 32000;
    config.padded_vocab = 32000;
    config.ffn_hidden = 6144;
    config.max_seq_len = 2048;
    return config;
  }
  std::string names;
  for (const std::string& preset : model_preset_names()) names += (names.empty() ? "" : ", ") + preset;
  throw Error(ErrorKind::config, "unknown model preset '" + name + "'", "use one of: " + names);
}

}  // namespace mxtrain
