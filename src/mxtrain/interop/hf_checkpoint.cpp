#include "mxtrain/interop/hf_checkpoint.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <tuple>

#include "mxtrain/core/error.hpp"

namespace mxtrain::interop {

namespace fs = std::filesystem;

namespace {

[[noreturn]] void unsupported(const std::string& origin, const std::string& field, const std::string& why) {
  throw Error(ErrorKind::config, origin + ": " + field + " " + why,
              "mxtrain imports Llama-style (llama, mistral and qwen2: a sliding window bounds train.seq_len) and GPT-2 "
              "checkpoints whose settings it computes exactly; see docs/huggingface.md");
}

int64_t integer(const nlohmann::json& config, const char* key, const std::string& origin) {
  const auto it = config.find(key);
  if (it == config.end() || !it->is_number_integer() || it->get<int64_t>() <= 0)
    unsupported(origin, key, "is missing or not a positive integer");
  return it->get<int64_t>();
}

// A key that must be absent, null, or equal to `expected`.
template <typename T>
void require(const nlohmann::json& config, const char* key, const T& expected, const std::string& origin,
             const std::string& why) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return;
  bool equal = false;
  try {
    equal = it->get<T>() == expected;
  } catch (const nlohmann::json::exception&) {
  }
  if (!equal) unsupported(origin, key, "= " + it->dump() + ": " + why);
}

double number(const nlohmann::json& config, const char* key, double fallback, const std::string& origin) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_number() || !(it->get<double>() > 0)) unsupported(origin, key, "is not a positive number");
  return it->get<double>();
}

bool boolean(const nlohmann::json& config, const char* key, bool fallback, const std::string& origin) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return fallback;
  if (!it->is_boolean()) unsupported(origin, key, "is not true or false");
  return it->get<bool>();
}

ModelConfig llama_config(const nlohmann::json& c, const std::string& origin, bool qwen2) {
  ModelConfig config;
  config.family = ModelFamily::llama;
  config.hidden = integer(c, "hidden_size", origin);
  config.ffn_hidden = integer(c, "intermediate_size", origin);
  config.layers = integer(c, "num_hidden_layers", origin);
  config.heads = integer(c, "num_attention_heads", origin);
  config.kv_heads = c.contains("num_key_value_heads") && !c["num_key_value_heads"].is_null()
                        ? integer(c, "num_key_value_heads", origin)
                        : config.heads;
  config.vocab_size = integer(c, "vocab_size", origin);
  config.max_seq_len = c.contains("max_position_embeddings") ? integer(c, "max_position_embeddings", origin) : 2048;
  config.norm_eps = static_cast<float>(number(c, "rms_norm_eps", 1e-6, origin));
  config.tied_embeddings = boolean(c, "tie_word_embeddings", false, origin);
  require(c, "hidden_act", std::string("silu"), origin, "mxtrain's Llama MLP is SwiGLU (silu)");
  require(c, "pretraining_tp", 1, origin, "tensor-parallel slicing of the projections is not reproduced");
  if (qwen2) {
    // Qwen2: biases on the query, key and value projections, none elsewhere (no config key says so).
    config.qkv_bias = true;
  } else {
    // Llama's attention_bias (q, k, v and o) and mlp_bias (gate, up and down) together are
    // mxtrain's model.bias (every linear); one without the other is not a shape mxtrain has.
    const bool attention_bias = boolean(c, "attention_bias", false, origin);
    const bool mlp_bias = boolean(c, "mlp_bias", false, origin);
    if (attention_bias != mlp_bias)
      unsupported(origin, attention_bias ? "attention_bias" : "mlp_bias",
                  "= true without " + std::string(attention_bias ? "mlp_bias" : "attention_bias") +
                      ": mxtrain's Llama has biases in every linear layer (both true) or in none");
    config.bias = attention_bias;
  }
  // The sliding window (Mistral's, or Qwen2's where use_sliding_window is on): kept, so that
  // training refuses sequences longer than it (where full causal attention would differ) and the
  // export writes it back. Mistral's is on unless use_sliding_window = false; Qwen2's is off
  // unless it is true, and then slides layers max_window_layers and up (or those layer_types says).
  const bool window_set = c.contains("sliding_window") && !c["sliding_window"].is_null();
  const bool window_on = qwen2 ? boolean(c, "use_sliding_window", false, origin)
                               : boolean(c, "use_sliding_window", true, origin);
  if (window_set && window_on) {
    int64_t sliding_layers = config.layers;
    if (qwen2) {
      if (c.contains("layer_types") && c["layer_types"].is_array()) {
        sliding_layers = 0;
        for (const auto& type : c["layer_types"]) sliding_layers += type == "sliding_attention";
      } else {
        int64_t first = 28;  // Qwen2Config's default
        if (c.contains("max_window_layers") && !c["max_window_layers"].is_null()) {
          if (!c["max_window_layers"].is_number_integer())
            unsupported(origin, "max_window_layers", "is not an integer");
          first = c["max_window_layers"].get<int64_t>();
        }
        sliding_layers = std::max<int64_t>(0, config.layers - std::max<int64_t>(0, first));
      }
    }
    if (sliding_layers > 0 && sliding_layers < config.layers)
      unsupported(origin, "use_sliding_window",
                  strf("= true slides %lld of %lld layers: mxtrain bounds every layer by one window or none (set "
                       "use_sliding_window to false, or max_window_layers to 0)",
                       static_cast<long long>(sliding_layers), static_cast<long long>(config.layers)));
    // A window beyond the longest sequence mxtrain takes (2^22 tokens) never binds.
    if (sliding_layers > 0)
      config.sliding_window = std::min<int64_t>(integer(c, "sliding_window", origin), int64_t{1} << 22);
  }
  if (c.contains("head_dim") && !c["head_dim"].is_null() && c["head_dim"] != config.hidden / config.heads)
    unsupported(origin, "head_dim", strf("= %s differs from hidden_size / num_attention_heads = %lld",
                                         c["head_dim"].dump().c_str(),
                                         static_cast<long long>(config.hidden / config.heads)));
  // rope_theta at the top level (older files) or in rope_parameters (newer ones).
  double theta = number(c, "rope_theta", 10000.0, origin);
  const nlohmann::json* scaling = nullptr;
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
    theta = number(c["rope_parameters"], "rope_theta", theta, origin);
    scaling = &c["rope_parameters"];
  }
  if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) scaling = &c["rope_scaling"];
  if (scaling) {
    const auto type = scaling->contains("rope_type") ? (*scaling)["rope_type"] : scaling->value("type", nlohmann::json());
    if (type == "llama3") {
      config.rope_scaling_factor = static_cast<float>(number(*scaling, "factor", 0.0, origin));
      config.rope_low_freq_factor = static_cast<float>(number(*scaling, "low_freq_factor", 1.0, origin));
      config.rope_high_freq_factor = static_cast<float>(number(*scaling, "high_freq_factor", 4.0, origin));
      config.rope_original_max_positions = integer(*scaling, "original_max_position_embeddings", origin);
      if (config.rope_scaling_factor <= 0 || config.rope_high_freq_factor <= config.rope_low_freq_factor)
        unsupported(origin, "rope_scaling", "has a llama3 factor <= 0 or high_freq_factor <= low_freq_factor");
    } else if (!type.is_null() && type != "default") {
      unsupported(origin, "rope_scaling", "has rope_type " + type.dump() +
                                              ": mxtrain computes the default and llama3 RoPE frequencies (not "
                                              "linear, dynamic, yarn or longrope scaling)");
    }
  }
  config.rope_theta = static_cast<float>(theta);
  return config;
}

ModelConfig gpt2_config(const nlohmann::json& c, const std::string& origin) {
  ModelConfig config;
  config.family = ModelFamily::gpt2;
  config.hidden = integer(c, "n_embd", origin);
  config.layers = integer(c, "n_layer", origin);
  config.heads = integer(c, "n_head", origin);
  config.kv_heads = config.heads;
  config.ffn_hidden = c.contains("n_inner") && !c["n_inner"].is_null() ? integer(c, "n_inner", origin) : 4 * config.hidden;
  config.vocab_size = integer(c, "vocab_size", origin);
  config.max_seq_len = integer(c, "n_positions", origin);
  config.norm_eps = static_cast<float>(number(c, "layer_norm_epsilon", 1e-5, origin));
  config.tied_embeddings = boolean(c, "tie_word_embeddings", true, origin);
  config.bias = true;
  const std::string activation = c.value("activation_function", std::string("gelu_new"));
  if (activation != "gelu_new" && activation != "gelu_pytorch_tanh")
    unsupported(origin, "activation_function", "= \"" + activation + "\": mxtrain's GPT-2 GELU is the tanh approximation "
                                               "(gelu_new)");
  require(c, "scale_attn_weights", true, origin, "attention without 1/sqrt(head_dim) is not reproduced");
  require(c, "scale_attn_by_inverse_layer_idx", false, origin, "per-layer attention scaling is not reproduced");
  return config;
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw Error(ErrorKind::config, "cannot read " + path,
                "point --init-from at a Hugging Face model directory (config.json and model.safetensors)");
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// A model directory's JSON file parsed; a damaged or truncated one is named with the parser's
// line and column, so the user knows it is the file and not mxtrain.
nlohmann::json read_json(const std::string& path, ErrorKind kind) {
  const std::string text = read_text(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& error) {
    throw Error(kind, path + " is not valid JSON (" + json_parser_message(error) + ")",
                "the file is damaged or was cut short: copy it again from the model's repository");
  }
}

// "layers.3.mlp.up.weight" → (3, "mlp.up.weight"); -1 for names outside the blocks.
std::pair<int64_t, std::string> split_layer(const std::string& name) {
  if (name.rfind("layers.", 0) != 0) return {-1, name};
  const size_t dot = name.find('.', 7);
  return {std::stoll(name.substr(7, dot - 7)), name.substr(dot + 1)};
}

}  // namespace

ModelConfig model_config_from_hf(const nlohmann::json& c, const std::string& origin) {
  if (!c.is_object()) throw Error(ErrorKind::config, origin + " is not a JSON object", "check the file");
  const std::string type = c.value("model_type", std::string());
  ModelConfig config;
  if (type == "llama" || type == "mistral" || type == "qwen2")
    config = llama_config(c, origin, type == "qwen2");
  else if (type == "gpt2")
    config = gpt2_config(c, origin);
  else
    unsupported(origin, "model_type", "= \"" + type + "\" is not an architecture mxtrain trains (llama, mistral, qwen2, gpt2)");
  config.preset = "hf-" + type;
  config.padded_vocab = (config.vocab_size + 63) / 64 * 64;
  config.validate();
  return config;
}

nlohmann::json hf_config_from_model(const ModelConfig& config, int bos_token_id, int eos_token_id) {
  if (config.family == ModelFamily::gpt2)
    return {{"model_type", "gpt2"},
            {"architectures", {"GPT2LMHeadModel"}},
            {"vocab_size", config.vocab_size},
            {"n_embd", config.hidden},
            {"n_layer", config.layers},
            {"n_head", config.heads},
            {"n_inner", config.ffn_hidden},
            {"n_positions", config.max_seq_len},
            {"n_ctx", config.max_seq_len},
            {"activation_function", "gelu_new"},
            {"layer_norm_epsilon", config.norm_eps},
            {"resid_pdrop", 0.0},
            {"embd_pdrop", 0.0},
            {"attn_pdrop", 0.0},
            {"scale_attn_weights", true},
            {"tie_word_embeddings", config.tied_embeddings},
            {"bos_token_id", bos_token_id},
            {"eos_token_id", eos_token_id},
            {"torch_dtype", "bfloat16"}};
  nlohmann::json llama = {{"model_type", "llama"},
          {"architectures", {"LlamaForCausalLM"}},
          {"vocab_size", config.vocab_size},
          {"hidden_size", config.hidden},
          {"intermediate_size", config.ffn_hidden},
          {"num_hidden_layers", config.layers},
          {"num_attention_heads", config.heads},
          {"num_key_value_heads", config.kv_heads},
          {"head_dim", config.head_dim()},
          {"hidden_act", "silu"},
          {"rms_norm_eps", config.norm_eps},
          {"rope_theta", config.rope_theta},
          {"max_position_embeddings", config.max_seq_len},
          {"tie_word_embeddings", config.tied_embeddings},
          {"attention_bias", false},
          {"mlp_bias", false},
          {"bos_token_id", bos_token_id},
          {"eos_token_id", eos_token_id},
          {"torch_dtype", "bfloat16"}};
  if (config.bias && config.sliding_window > 0)
    throw Error(ErrorKind::config,
                "a Llama with biases in every linear layer (model.bias) and a sliding window (model.sliding_window) "
                "has no transformers architecture to export to (Mistral's has no biases)",
                "train it without one of the two, or export the native checkpoint only");
  if (config.bias) {  // every linear's bias: Llama's attention_bias and mlp_bias
    llama["attention_bias"] = true;
    llama["mlp_bias"] = true;
  } else if (config.qkv_bias) {  // biases on q, k and v alone: Qwen2, with its window (every layer) or none
    llama.erase("attention_bias");
    llama.erase("mlp_bias");
    llama["model_type"] = "qwen2";
    llama["architectures"] = {"Qwen2ForCausalLM"};
    llama["use_sliding_window"] = config.sliding_window > 0;
    llama["sliding_window"] = config.sliding_window > 0 ? nlohmann::json(config.sliding_window) : nlohmann::json();
    llama["max_window_layers"] = config.sliding_window > 0 ? 0 : config.layers;
  }
  if (config.sliding_window > 0 && !config.qkv_bias) {  // Mistral: the same tensors, and its window
    llama["model_type"] = "mistral";
    llama["architectures"] = {"MistralForCausalLM"};
    llama["sliding_window"] = config.sliding_window;
  }
  if (config.rope_scaling_factor > 0)
    llama["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", config.rope_scaling_factor},
                             {"low_freq_factor", config.rope_low_freq_factor},
                             {"high_freq_factor", config.rope_high_freq_factor},
                             {"original_max_position_embeddings", config.rope_original_max_positions}};
  return llama;
}

void apply_init_from(RunConfig& run) {
  ModelConfig& m = run.model;
  if (m.init_from.empty()) return;
  const std::string path = (fs::path(m.init_from) / "config.json").string();
  const nlohmann::json json = read_json(path, ErrorKind::config);
  ModelConfig hf = model_config_from_hf(json, path);
  const ModelConfig preset = model_preset(m.preset);
  auto agree = [&](const char* key, auto set, auto preset_value, auto file_value) {
    if (set != preset_value && set != file_value)
      throw Error(ErrorKind::config,
                  strf("model.%s = %s, but %s says %s", key, std::to_string(set).c_str(), path.c_str(),
                       std::to_string(file_value).c_str()),
                  strf("drop model.%s: with model.init_from the model's shape comes from its config.json", key));
  };
  agree("vocab_size", m.vocab_size, preset.vocab_size, hf.vocab_size);
  agree("hidden", m.hidden, preset.hidden, hf.hidden);
  agree("layers", m.layers, preset.layers, hf.layers);
  agree("heads", m.heads, preset.heads, hf.heads);
  agree("kv_heads", m.kv_heads, preset.kv_heads, hf.kv_heads);
  agree("ffn_hidden", m.ffn_hidden, preset.ffn_hidden, hf.ffn_hidden);
  for (const auto& [key, set, preset_value, file_value] :
       {std::tuple{"bias", m.bias, preset.bias, hf.bias}, std::tuple{"qkv_bias", m.qkv_bias, preset.qkv_bias, hf.qkv_bias}})
    if (set != preset_value && set != file_value)
      throw Error(ErrorKind::config,
                  strf("model.%s = %s, but %s has %s", key, set ? "true" : "false", path.c_str(),
                       file_value ? "these biases" : "no such biases"),
                  strf("drop model.%s: with model.init_from the model's shape comes from its config.json", key));
  if (m.padded_vocab != preset.padded_vocab && m.padded_vocab >= hf.vocab_size) hf.padded_vocab = m.padded_vocab;
  hf.init_from = m.init_from;
  hf.init_std = m.init_std;
  hf.validate();
  m = hf;
  validate(run);  // the rules that join the model and the run (train.seq_len and a sliding window)
}

HfSource hf_source(const ModelConfig& config, const ParamSpec& spec) {
  const bool gpt2 = config.family == ModelFamily::gpt2;
  const auto [layer, local] = split_layer(spec.name);
  const int64_t C = config.hidden, D = config.head_dim(), F = config.ffn_hidden;
  HfSource source;
  auto one = [&](const std::string& tensor, int64_t rows, bool transposed = false) {
    source.parts.push_back({tensor, rows, transposed});
  };
  if (layer < 0) {
    if (spec.name == "embed.token" || spec.name == "head.weight") {
      one(spec.name == "head.weight" ? "lm_head.weight" : gpt2 ? "transformer.wte.weight" : "model.embed_tokens.weight",
          config.vocab_size);
    } else if (spec.name == "embed.position") {
      one("transformer.wpe.weight", config.max_seq_len);
    } else if (spec.name == "final_norm.weight" || spec.name == "final_norm.bias") {
      const std::string kind = spec.name.substr(spec.name.find('.') + 1);
      one(gpt2 ? "transformer.ln_f." + kind : "model.norm." + kind, C);
    }
  } else if (gpt2) {
    const std::string p = "transformer.h." + std::to_string(layer) + ".";
    if (local == "attn.qkv.weight") one(p + "attn.c_attn.weight", 3 * C, true);
    if (local == "attn.qkv.bias") one(p + "attn.c_attn.bias", 3 * C);
    if (local == "attn.out.weight") one(p + "attn.c_proj.weight", C, true);
    if (local == "attn.out.bias") one(p + "attn.c_proj.bias", C);
    if (local == "mlp.up.weight") one(p + "mlp.c_fc.weight", F, true);
    if (local == "mlp.up.bias") one(p + "mlp.c_fc.bias", F);
    if (local == "mlp.down.weight") one(p + "mlp.c_proj.weight", C, true);
    if (local == "mlp.down.bias") one(p + "mlp.c_proj.bias", C);
    if (local == "attn_norm.weight") one(p + "ln_1.weight", C);
    if (local == "attn_norm.bias") one(p + "ln_1.bias", C);
    if (local == "mlp_norm.weight") one(p + "ln_2.weight", C);
    if (local == "mlp_norm.bias") one(p + "ln_2.bias", C);
  } else {
    const std::string p = "model.layers." + std::to_string(layer) + ".";
    // Biases (Qwen2's on q, k and v; a Llama's with attention_bias and mlp_bias on every linear)
    // are laid out as their weights' rows.
    for (const char* kind : {"weight", "bias"}) {
      const std::string suffix = std::string(".") + kind;
      if (local == "attn.qkv" + suffix) {
        one(p + "self_attn.q_proj" + suffix, config.heads * D);
        one(p + "self_attn.k_proj" + suffix, config.kv_heads * D);
        one(p + "self_attn.v_proj" + suffix, config.kv_heads * D);
      }
      if (local == "attn.out" + suffix) one(p + "self_attn.o_proj" + suffix, C);
      if (local == "mlp.up" + suffix) {
        one(p + "mlp.gate_proj" + suffix, F);  // the SiLU side at even rows
        one(p + "mlp.up_proj" + suffix, F);
        source.interleaved = true;
      }
      if (local == "mlp.down" + suffix) one(p + "mlp.down_proj" + suffix, C);
    }
    if (local == "attn_norm.weight") one(p + "input_layernorm.weight", C);
    if (local == "mlp_norm.weight") one(p + "post_attention_layernorm.weight", C);
  }
  if (source.parts.empty())
    throw Error(ErrorKind::internal, "no Hugging Face name for mxtrain parameter " + spec.name, "this is a bug");
  return source;
}

HfCheckpoint::HfCheckpoint(const std::string& directory) : directory_(directory) {
  const fs::path dir(directory);
  const std::string config_path = (dir / "config.json").string();
  config_json_ = read_json(config_path, ErrorKind::config);
  config_ = model_config_from_hf(config_json_, config_path);

  std::vector<std::string> files;
  const fs::path index = dir / "model.safetensors.index.json";
  std::error_code error;
  if (fs::is_regular_file(index, error)) {
    const nlohmann::json map = read_json(index.string(), ErrorKind::data);
    if (!map.is_object() || !map.contains("weight_map") || !map["weight_map"].is_object())
      throw Error(ErrorKind::data, index.string() + " has no weight_map object", "check the file");
    std::set<std::string> names;
    for (const auto& [tensor, file] : map["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw Error(ErrorKind::data, index.string() + ": tensor " + tensor + " maps to a bad file name", "check the file");
      names.insert(file.get<std::string>());
    }
    for (const std::string& name : names) files.push_back((dir / name).string());
  } else if (fs::is_regular_file(dir / "model.safetensors", error)) {
    files.push_back((dir / "model.safetensors").string());
  } else {
    throw Error(ErrorKind::data, directory + " holds neither model.safetensors nor model.safetensors.index.json",
                "save the model with save_pretrained (safetensors is its default format)");
  }
  for (const std::string& file : files) {
    files_.push_back(std::make_unique<SafetensorsReader>(file));
    for (const SafetensorsTensor& tensor : files_.back()->tensors()) {
      // GPT2Model checkpoints name tensors without GPT2LMHeadModel's "transformer." prefix.
      std::string name = tensor.name;
      if (config_.family == ModelFamily::gpt2 && name.rfind("transformer.", 0) != 0 && name != "lm_head.weight")
        name = "transformer." + name;
      if (!tensors_.emplace(name, std::make_pair(files_.back().get(), &tensor)).second)
        throw Error(ErrorKind::data, "tensor " + name + " appears twice in " + directory, "check the checkpoint");
    }
  }
}

const SafetensorsTensor& HfCheckpoint::tensor(const std::string& name, const SafetensorsReader** reader) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end())
    throw Error(ErrorKind::data, "the checkpoint in " + directory_ + " has no tensor " + name,
                "the checkpoint is incomplete or of another architecture than its config.json says");
  *reader = it->second.first;
  return *it->second.second;
}

void HfCheckpoint::check(const ModelLayout& layout) const {
  std::set<std::string> used;
  std::vector<std::string> problems;
  for (const ParamGroup& group : layout.groups)
    for (const ParamSpec& spec : group.params) {
      const int64_t cols = spec.shape.rank == 2 ? spec.shape[1] : 1;
      for (const HfSource::Part& part : hf_source(config_, spec).parts) {
        used.insert(part.tensor);
        const auto it = tensors_.find(part.tensor);
        if (it == tensors_.end()) {
          problems.push_back("missing " + part.tensor);
          continue;
        }
        const SafetensorsTensor& t = *it->second.second;
        std::vector<int64_t> expected =
            spec.shape.rank == 1 ? std::vector<int64_t>{part.rows}
                                 : part.transposed ? std::vector<int64_t>{cols, part.rows} : std::vector<int64_t>{part.rows, cols};
        if (t.shape != expected) {
          std::string got, want;
          for (int64_t d : t.shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
          for (int64_t d : expected) want += (want.empty() ? "" : ", ") + std::to_string(d);
          problems.push_back(part.tensor + " is [" + got + "], expected [" + want + "]");
        }
        if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
          problems.push_back(part.tensor + " is " + t.dtype + " (F32, BF16 or F16 expected)");
      }
    }
  for (const auto& [name, entry] : tensors_) {
    if (used.count(name)) continue;
    const bool buffer = name.find("rotary_emb.inv_freq") != std::string::npos ||
                        (name.size() > 9 && (name.compare(name.size() - 9, 9, "attn.bias") == 0 ||
                                             name.find("attn.masked_bias") != std::string::npos));
    if (buffer || (name == "lm_head.weight" && config_.tied_embeddings)) continue;
    problems.push_back("unexpected tensor " + name);
  }
  if (problems.empty()) return;
  std::string list;
  for (size_t i = 0; i < problems.size() && i < 12; ++i) list += "\n  " + problems[i];
  if (problems.size() > 12) list += strf("\n  ... and %zu more", problems.size() - 12);
  throw Error(ErrorKind::data, "the checkpoint in " + directory_ + " does not match its config.json:" + list,
              "re-save the model with save_pretrained, or fix config.json to describe these weights");
}

ParameterValues HfCheckpoint::parameter_values() const {
  return [this](const ParamSpec& spec, int64_t begin, int64_t count, float* out) { values(spec, begin, count, out); };
}

void HfCheckpoint::values(const ParamSpec& spec, int64_t begin, int64_t count, float* out) const {
  const int64_t cols = spec.shape.rank == 2 ? spec.shape[1] : 1;
  const HfSource source = hf_source(config_, spec);
  if (source.interleaved) {
    // Rows first_row..last_row of the parameter: each part's rows among them, read as one block.
    const int64_t n = static_cast<int64_t>(source.parts.size());
    if (count <= 0) return;
    const int64_t first_row = begin / cols, last_row = (begin + count - 1) / cols;
    std::vector<float> block;
    for (int64_t k = 0; k < n; ++k) {
      const HfSource::Part& part = source.parts[static_cast<size_t>(k)];
      // Part k's rows j with first_row <= n·j + k <= last_row.
      const int64_t j0 = first_row <= k ? 0 : (first_row - k + n - 1) / n;
      if (n * j0 + k > last_row) continue;
      const int64_t j1 = std::min((last_row - k) / n, part.rows - 1);
      const SafetensorsReader* reader = nullptr;
      const SafetensorsTensor& t = tensor(part.tensor, &reader);
      block.resize(static_cast<size_t>((j1 - j0 + 1) * cols));
      reader->read_f32(t, j0 * cols, (j1 - j0 + 1) * cols, block.data());
      for (int64_t j = j0; j <= j1; ++j) {
        const int64_t row_start = (n * j + k) * cols;
        const int64_t from = std::max(begin, row_start), to = std::min(begin + count, row_start + cols);
        for (int64_t e = from; e < to; ++e) out[e - begin] = block[static_cast<size_t>((j - j0) * cols + e - row_start)];
      }
    }
    return;
  }
  int64_t part_first_row = 0;
  for (const HfSource::Part& part : source.parts) {
    const int64_t part_begin = part_first_row * cols, part_end = (part_first_row + part.rows) * cols;
    part_first_row += part.rows;
    const int64_t from = std::max(begin, part_begin), to = std::min(begin + count, part_end);
    if (from >= to) continue;
    const SafetensorsReader* reader = nullptr;
    const SafetensorsTensor& t = tensor(part.tensor, &reader);
    if (!part.transposed) {
      reader->read_f32(t, from - part_begin, to - from, out + (from - begin));
    } else {
      // The tensor holds Wᵀ [cols, rows]: read it whole (one matrix), then gather the rows.
      std::vector<float> whole(static_cast<size_t>(t.numel()));
      reader->read_f32(t, 0, t.numel(), whole.data());
      for (int64_t e = from; e < to; ++e) {
        const int64_t row = (e - part_begin) / cols, col = (e - part_begin) % cols;
        out[e - begin] = whole[static_cast<size_t>(col * part.rows + row)];
      }
    }
  }
  // Vocabulary padding: zero rows past the tensor's.
  for (int64_t e = std::max(begin, part_first_row * cols); e < begin + count; ++e) out[e - begin] = 0.0f;
}

}  // namespace mxtrain::interop
