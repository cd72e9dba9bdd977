// Hugging Face checkpoints → mxtrain parameters: config.json mapping (and its refusals, each
// naming the field), the name/layout mapping on a synthetic checkpoint whose every value encodes
// where it came from (q/k/v and gate/up stacking, GPT-2's transposed Conv1D, vocabulary padding,
// shards), and clear errors for missing, mis-shaped and unknown tensors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/interop/hf_checkpoint.hpp"
#include "mxtrain/interop/safetensors.hpp"
#include "support/test_support.hpp"

namespace mxtrain::interop {
namespace {

nlohmann::json llama_json() {
  return {{"model_type", "llama"}, {"vocab_size", 100},        {"hidden_size", 16},
          {"intermediate_size", 24}, {"num_hidden_layers", 2}, {"num_attention_heads", 4},
          {"num_key_value_heads", 2}, {"rms_norm_eps", 1e-6},  {"rope_theta", 500000.0},
          {"max_position_embeddings", 64}, {"tie_word_embeddings", false}, {"hidden_act", "silu"}};
}

nlohmann::json gpt2_json() {
  return {{"model_type", "gpt2"}, {"vocab_size", 70}, {"n_embd", 16}, {"n_layer", 1}, {"n_head", 2},
          {"n_positions", 32}, {"n_inner", nullptr}, {"activation_function", "gelu_new"}, {"layer_norm_epsilon", 1e-5}};
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.full_message();
  }
  return "(no error)";
}

TEST(HfConfig, LlamaAndGpt2MapOntoModelConfig) {
  const ModelConfig llama = model_config_from_hf(llama_json(), "config.json");
  EXPECT_EQ(llama.family, ModelFamily::llama);
  EXPECT_EQ(llama.hidden, 16);
  EXPECT_EQ(llama.kv_heads, 2);
  EXPECT_EQ(llama.ffn_hidden, 24);
  EXPECT_EQ(llama.vocab_size, 100);
  EXPECT_EQ(llama.padded_vocab, 128);
  EXPECT_FLOAT_EQ(llama.rope_theta, 500000.0f);
  EXPECT_FLOAT_EQ(llama.norm_eps, 1e-6f);
  EXPECT_FALSE(llama.tied_embeddings);
  const ModelConfig gpt2 = model_config_from_hf(gpt2_json(), "config.json");
  EXPECT_EQ(gpt2.family, ModelFamily::gpt2);
  EXPECT_EQ(gpt2.ffn_hidden, 64);  // n_inner null = 4 x n_embd
  EXPECT_EQ(gpt2.max_seq_len, 32);
  EXPECT_TRUE(gpt2.tied_embeddings);
  EXPECT_TRUE(gpt2.bias);
  // The export's config.json maps back to the same model.
  const ModelConfig again = model_config_from_hf(hf_config_from_model(llama, 1, 2), "exported");
  EXPECT_EQ(again.hidden, llama.hidden);
  EXPECT_EQ(again.kv_heads, llama.kv_heads);
  EXPECT_EQ(again.vocab_size, llama.vocab_size);
  EXPECT_FLOAT_EQ(again.rope_theta, llama.rope_theta);
}

TEST(HfConfig, Llama3RopeScalingRoundTrips) {
  nlohmann::json json = llama_json();
  json["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                          {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
  const ModelConfig config = model_config_from_hf(json, "config.json");
  EXPECT_FLOAT_EQ(config.rope_scaling_factor, 32.0f);
  EXPECT_EQ(config.rope_original_max_positions, 8192);
  EXPECT_TRUE(config.rope().scaled());
  const nlohmann::json exported = hf_config_from_model(config, 1, 2);
  EXPECT_EQ(exported["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(model_config_from_hf(exported, "exported").rope_original_max_positions, 8192);
  // No scaling: no rope_scaling key.
  EXPECT_FALSE(hf_config_from_model(model_config_from_hf(llama_json(), "c"), 1, 2).contains("rope_scaling"));
}

// Mistral's sliding window is kept: training refuses sequences longer than it (full causal
// attention equals the window's only within it), and the export writes a Mistral config back.
TEST(HfConfig, AMistralSlidingWindowBoundsTheSequenceAndIsExported) {
  nlohmann::json mistral = llama_json();
  mistral["model_type"] = "mistral";
  mistral["sliding_window"] = 64;
  const ModelConfig config = model_config_from_hf(mistral, "c");
  EXPECT_EQ(config.sliding_window, 64);
  EXPECT_EQ(config.attention_context(), std::min<int64_t>(64, config.max_seq_len));
  const nlohmann::json exported = hf_config_from_model(config, 1, 2);
  EXPECT_EQ(exported["model_type"], "mistral");
  EXPECT_EQ(exported["architectures"][0], "MistralForCausalLM");
  EXPECT_EQ(exported["sliding_window"], 64);
  EXPECT_EQ(model_config_from_hf(exported, "exported").sliding_window, 64);
  nlohmann::json none = mistral;  // Mistral v0.3: null
  none["sliding_window"] = nullptr;
  EXPECT_EQ(model_config_from_hf(none, "c").sliding_window, 0);
  none.erase("sliding_window");
  EXPECT_EQ(model_config_from_hf(none, "c").sliding_window, 0);
  nlohmann::json unused = mistral;  // Qwen2's way of saying the window is off
  unused["use_sliding_window"] = false;
  EXPECT_EQ(model_config_from_hf(unused, "c").sliding_window, 0);
  EXPECT_FALSE(hf_config_from_model(model_config_from_hf(llama_json(), "c"), 1, 2).contains("sliding_window"));

  RunConfig run;
  run.model = config;
  run.train.seq_len = 64;
  EXPECT_NO_THROW(validate(run));
  run.train.seq_len = 65;
  const std::string message = error_of([&] { validate(run); });
  EXPECT_NE(message.find("train.seq_len = 65 is longer than model.sliding_window = 64"), std::string::npos) << message;
  EXPECT_NE(message.find("set train.seq_len <= 64"), std::string::npos) << message;
}

// Qwen2 is a Llama with biases on the query, key and value projections (model.qkv_bias); its
// use_sliding_window is off unless set, and then binds only when it slides every layer. A Llama
// with attention_bias and mlp_bias has biases on every linear (model.bias). Each is exported
// under its own architecture and maps back to the same model.
TEST(HfConfig, Qwen2AndLlamaBiasesMapOntoTheirOwnArchitecture) {
  nlohmann::json qwen2 = llama_json();
  qwen2["model_type"] = "qwen2";
  qwen2["use_sliding_window"] = false;
  qwen2["sliding_window"] = 4096;
  qwen2["max_window_layers"] = 21;
  const ModelConfig config = model_config_from_hf(qwen2, "c");
  EXPECT_TRUE(config.qkv_bias);
  EXPECT_FALSE(config.bias);
  EXPECT_EQ(config.sliding_window, 0);
  const ModelLayout layout = build_layout(config);
  int group = 0, index = 0;
  EXPECT_TRUE(layout.locate("layers.1.attn.qkv.bias", &group, &index));
  EXPECT_FALSE(layout.locate("layers.1.attn.out.bias", &group, &index));
  EXPECT_FALSE(layout.locate("layers.1.mlp.up.bias", &group, &index));
  EXPECT_EQ(layout.parameter_count(), config.parameter_count());
  const nlohmann::json exported = hf_config_from_model(config, 1, 2);
  EXPECT_EQ(exported["model_type"], "qwen2");
  EXPECT_EQ(exported["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(exported["use_sliding_window"], false);
  EXPECT_FALSE(exported.contains("attention_bias"));
  const ModelConfig back = model_config_from_hf(exported, "exported");
  EXPECT_TRUE(back.qkv_bias);
  EXPECT_EQ(back.sliding_window, 0);

  // use_sliding_window: every layer slides (max_window_layers 0, or layer_types) → the window;
  // none → no window; some → refused, naming the key.
  nlohmann::json sliding = qwen2;
  sliding["use_sliding_window"] = true;
  sliding["max_window_layers"] = 0;
  const ModelConfig windowed = model_config_from_hf(sliding, "c");
  EXPECT_EQ(windowed.sliding_window, 4096);
  const nlohmann::json windowed_export = hf_config_from_model(windowed, 1, 2);
  EXPECT_EQ(windowed_export["model_type"], "qwen2");
  EXPECT_EQ(windowed_export["use_sliding_window"], true);
  EXPECT_EQ(windowed_export["max_window_layers"], 0);
  EXPECT_EQ(model_config_from_hf(windowed_export, "exported").sliding_window, 4096);
  sliding["max_window_layers"] = 2;  // layers 2 and up: none of the two
  EXPECT_EQ(model_config_from_hf(sliding, "c").sliding_window, 0);
  sliding["max_window_layers"] = 1;
  std::string message = error_of([&] { model_config_from_hf(sliding, "dir/config.json"); });
  EXPECT_NE(message.find("use_sliding_window = true slides 1 of 2 layers"), std::string::npos) << message;
  sliding["layer_types"] = {"full_attention", "full_attention"};
  EXPECT_EQ(model_config_from_hf(sliding, "c").sliding_window, 0);
  sliding["layer_types"] = {"sliding_attention", "sliding_attention"};
  EXPECT_EQ(model_config_from_hf(sliding, "c").sliding_window, 4096);

  nlohmann::json biased = llama_json();
  biased["attention_bias"] = true;
  biased["mlp_bias"] = true;
  const ModelConfig llama_bias = model_config_from_hf(biased, "c");
  EXPECT_TRUE(llama_bias.bias);
  EXPECT_TRUE(build_layout(llama_bias).locate("layers.0.mlp.down.bias", &group, &index));
  const nlohmann::json llama_export = hf_config_from_model(llama_bias, 1, 2);
  EXPECT_EQ(llama_export["model_type"], "llama");
  EXPECT_EQ(llama_export["attention_bias"], true);
  EXPECT_EQ(llama_export["mlp_bias"], true);
  EXPECT_TRUE(model_config_from_hf(llama_export, "exported").bias);
  // With model.init_from the biases come from config.json: a run's own setting must agree.
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << llama_json().dump();
  RunConfig run;
  run.model.init_from = dir.path();
  run.model.qkv_bias = true;
  message = error_of([&] { apply_init_from(run); });
  EXPECT_NE(message.find("model.qkv_bias = true, but"), std::string::npos) << message;
  EXPECT_NE(message.find("drop model.qkv_bias"), std::string::npos) << message;
  // Mistral has no biases: a Llama with both has nothing to be exported as.
  ModelConfig biased_window = llama_bias;
  biased_window.sliding_window = 32;
  message = error_of([&] { hf_config_from_model(biased_window, 1, 2); });
  EXPECT_NE(message.find("has no transformers architecture"), std::string::npos) << message;
}

TEST(HfConfig, WhatIsNotReproducedIsRefusedByName) {
  struct Case {
    const char* key;
    nlohmann::json value;
    const char* expected;
  } cases[] = {
      {"model_type", "qwen3", "model_type"},
      {"hidden_act", "gelu", "hidden_act"},
      {"attention_bias", true, "attention_bias = true without mlp_bias"},
      {"mlp_bias", true, "mlp_bias = true without attention_bias"},
      {"head_dim", 8, "head_dim"},
      {"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}, "rope_scaling"},
      {"sliding_window", -1, "sliding_window"},
      {"hidden_size", -3, "hidden_size"},
  };
  for (const Case& c : cases) {
    nlohmann::json json = llama_json();
    json[c.key] = c.value;
    const std::string message = error_of([&] { model_config_from_hf(json, "dir/config.json"); });
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.key << ": " << message;
    EXPECT_NE(message.find("dir/config.json"), std::string::npos) << message;
  }
  nlohmann::json gelu = gpt2_json();
  gelu["activation_function"] = "relu";
  EXPECT_NE(error_of([&] { model_config_from_hf(gelu, "c"); }).find("activation_function"), std::string::npos);
}

// A checkpoint whose tensors hold value = tensor_code * 1000 + element index, in BF16-exact
// integers (f32 files; small enough to be exact).
struct Synthetic {
  test::TempDir dir;
  std::map<std::string, std::vector<int64_t>> shapes;
  std::map<std::string, float> codes;

  void add(const std::string& name, std::vector<int64_t> shape) {
    codes[name] = static_cast<float>(codes.size() + 1);
    shapes[name] = std::move(shape);
  }
  float value(const std::string& name, int64_t index) const { return codes.at(name) * 1000.0f + static_cast<float>(index); }
  // Writes config.json and the tensors; `files` > 1 writes shards with an index.
  void write(const nlohmann::json& config, int files = 1) {
    std::ofstream(dir.file("config.json")) << config.dump();
    std::vector<std::vector<std::string>> parts(static_cast<size_t>(files));
    size_t i = 0;
    for (const auto& entry : shapes) parts[i++ % parts.size()].push_back(entry.first);
    nlohmann::json index{{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
    for (size_t f = 0; f < parts.size(); ++f) {
      const std::string file = files == 1 ? "model.safetensors" : strf("model-%05zu-of-%05d.safetensors", f + 1, files);
      std::vector<SafetensorsWriter::Declaration> declarations;
      for (const std::string& name : parts[f]) declarations.push_back({name, DType::f32, shapes.at(name)});
      SafetensorsWriter writer(dir.file(file), declarations);
      for (const std::string& name : parts[f]) {
        int64_t numel = 1;
        for (int64_t d : shapes.at(name)) numel *= d;
        std::vector<float> data(static_cast<size_t>(numel));
        for (int64_t e = 0; e < numel; ++e) data[static_cast<size_t>(e)] = value(name, e);
        writer.append(data.data(), data.size() * 4);
        index["weight_map"][name] = file;
      }
      writer.commit();
    }
    if (files > 1) std::ofstream(dir.file("model.safetensors.index.json")) << index.dump();
  }
};

void fill_llama(Synthetic& s, bool tied) {
  s.add("model.embed_tokens.weight", {100, 16});
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    s.add(p + "self_attn.q_proj.weight", {16, 16});
    s.add(p + "self_attn.k_proj.weight", {8, 16});
    s.add(p + "self_attn.v_proj.weight", {8, 16});
    s.add(p + "self_attn.o_proj.weight", {16, 16});
    s.add(p + "mlp.gate_proj.weight", {24, 16});
    s.add(p + "mlp.up_proj.weight", {24, 16});
    s.add(p + "mlp.down_proj.weight", {16, 24});
    s.add(p + "input_layernorm.weight", {16});
    s.add(p + "post_attention_layernorm.weight", {16});
  }
  s.add("model.norm.weight", {16});
  if (!tied) s.add("lm_head.weight", {100, 16});
}

std::vector<float> parameter(const HfCheckpoint& checkpoint, const std::string& name, int64_t begin = 0,
                             int64_t count = -1) {
  const ModelLayout layout = build_layout(checkpoint.config());
  int group = 0, index = 0;
  EXPECT_TRUE(layout.locate(name, &group, &index)) << name;
  const ParamSpec& spec = layout.groups[static_cast<size_t>(group)].params[static_cast<size_t>(index)];
  std::vector<float> out(static_cast<size_t>(count < 0 ? spec.numel() : count), -1.0f);
  checkpoint.values(spec, begin, static_cast<int64_t>(out.size()), out.data());
  return out;
}

TEST(HfCheckpoint, LlamaTensorsStackIntoMxtrainParameters) {
  for (int files : {1, 3}) {
    Synthetic s;
    fill_llama(s, false);
    s.write(llama_json(), files);
    HfCheckpoint checkpoint(s.dir.path());
    checkpoint.check(build_layout(checkpoint.config()));
    // qkv rows: q (16), then k (8), then v (8).
    const std::vector<float> qkv = parameter(checkpoint, "layers.1.attn.qkv.weight");
    ASSERT_EQ(qkv.size(), 32u * 16u);
    EXPECT_EQ(qkv[0], s.value("model.layers.1.self_attn.q_proj.weight", 0));
    EXPECT_EQ(qkv[16 * 16 + 5], s.value("model.layers.1.self_attn.k_proj.weight", 5));
    EXPECT_EQ(qkv[24 * 16 + 17], s.value("model.layers.1.self_attn.v_proj.weight", 17));
    // up rows interleaved: gate_proj's row j at row 2j, up_proj's at 2j + 1 (24 rows each).
    const std::vector<float> up = parameter(checkpoint, "layers.0.mlp.up.weight");
    ASSERT_EQ(up.size(), 48u * 16u);
    for (int64_t j = 0; j < 24; ++j)
      for (int64_t c = 0; c < 16; c += 5) {
        EXPECT_EQ(up[static_cast<size_t>(2 * j * 16 + c)], s.value("model.layers.0.mlp.gate_proj.weight", j * 16 + c));
        EXPECT_EQ(up[static_cast<size_t>((2 * j + 1) * 16 + c)], s.value("model.layers.0.mlp.up_proj.weight", j * 16 + c));
      }
    // Ranges that start and end inside rows read the same values as the whole parameter.
    for (const auto& [begin, count] : std::vector<std::pair<int64_t, int64_t>>{{5, 7}, {13, 40}, {47 * 16 - 3, 19}, {16, 16}})
      EXPECT_EQ(parameter(checkpoint, "layers.0.mlp.up.weight", begin, count),
                std::vector<float>(up.begin() + begin, up.begin() + begin + count));
    // The vocabulary is padded from 100 to 128 rows with zeros; a range across the edge.
    const std::vector<float> embed = parameter(checkpoint, "embed.token", 99 * 16, 32);
    EXPECT_EQ(embed[15], s.value("model.embed_tokens.weight", 99 * 16 + 15));
    EXPECT_EQ(embed[16], 0.0f);
    EXPECT_EQ(parameter(checkpoint, "head.weight")[17], s.value("lm_head.weight", 17));
    EXPECT_EQ(parameter(checkpoint, "final_norm.weight")[7], s.value("model.norm.weight", 7));
    EXPECT_EQ(parameter(checkpoint, "layers.1.mlp_norm.weight")[2],
              s.value("model.layers.1.post_attention_layernorm.weight", 2));
  }
}

// Qwen2's q/k/v_proj biases stack like their weights; a Llama's mlp biases interleave like
// gate_proj's and up_proj's rows.
TEST(HfCheckpoint, BiasesStackLikeTheirWeights) {
  Synthetic qwen2;
  fill_llama(qwen2, true);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".self_attn.";
    qwen2.add(p + "q_proj.bias", {16});
    qwen2.add(p + "k_proj.bias", {8});
    qwen2.add(p + "v_proj.bias", {8});
  }
  nlohmann::json config = llama_json();
  config["model_type"] = "qwen2";
  config["tie_word_embeddings"] = true;
  qwen2.write(config);
  const HfCheckpoint checkpoint(qwen2.dir.path());
  checkpoint.check(build_layout(checkpoint.config()));
  const std::vector<float> qkv = parameter(checkpoint, "layers.1.attn.qkv.bias");
  ASSERT_EQ(qkv.size(), 32u);
  EXPECT_EQ(qkv[3], qwen2.value("model.layers.1.self_attn.q_proj.bias", 3));
  EXPECT_EQ(qkv[16 + 7], qwen2.value("model.layers.1.self_attn.k_proj.bias", 7));
  EXPECT_EQ(qkv[24], qwen2.value("model.layers.1.self_attn.v_proj.bias", 0));

  Synthetic llama;
  fill_llama(llama, false);
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* name : {"self_attn.q_proj.bias", "self_attn.o_proj.bias", "mlp.down_proj.bias"})
      llama.add(p + name, {16});
    llama.add(p + "self_attn.k_proj.bias", {8});
    llama.add(p + "self_attn.v_proj.bias", {8});
    llama.add(p + "mlp.gate_proj.bias", {24});
    llama.add(p + "mlp.up_proj.bias", {24});
  }
  config = llama_json();
  config["attention_bias"] = true;
  config["mlp_bias"] = true;
  llama.write(config);
  const HfCheckpoint biased(llama.dir.path());
  biased.check(build_layout(biased.config()));
  const std::vector<float> up = parameter(biased, "layers.0.mlp.up.bias");
  ASSERT_EQ(up.size(), 48u);
  for (int64_t j = 0; j < 24; ++j) {
    EXPECT_EQ(up[static_cast<size_t>(2 * j)], llama.value("model.layers.0.mlp.gate_proj.bias", j));
    EXPECT_EQ(up[static_cast<size_t>(2 * j + 1)], llama.value("model.layers.0.mlp.up_proj.bias", j));
  }
  EXPECT_EQ(parameter(biased, "layers.1.attn.out.bias")[5], llama.value("model.layers.1.self_attn.o_proj.bias", 5));
  EXPECT_EQ(parameter(biased, "layers.1.mlp.down.bias")[9], llama.value("model.layers.1.mlp.down_proj.bias", 9));
}

TEST(HfCheckpoint, Gpt2Conv1DWeightsAreTransposed) {
  Synthetic s;
  s.add("transformer.wte.weight", {70, 16});
  s.add("transformer.wpe.weight", {32, 16});
  const std::string p = "transformer.h.0.";
  s.add(p + "ln_1.weight", {16});
  s.add(p + "ln_1.bias", {16});
  s.add(p + "attn.c_attn.weight", {16, 48});
  s.add(p + "attn.c_attn.bias", {48});
  s.add(p + "attn.c_proj.weight", {16, 16});
  s.add(p + "attn.c_proj.bias", {16});
  s.add(p + "ln_2.weight", {16});
  s.add(p + "ln_2.bias", {16});
  s.add(p + "mlp.c_fc.weight", {16, 64});
  s.add(p + "mlp.c_fc.bias", {64});
  s.add(p + "mlp.c_proj.weight", {64, 16});
  s.add(p + "mlp.c_proj.bias", {16});
  s.add(p + "attn.bias", {1, 1, 32, 32});  // GPT-2's causal-mask buffer: ignored
  s.add("transformer.ln_f.weight", {16});
  s.add("transformer.ln_f.bias", {16});
  s.write(gpt2_json());
  HfCheckpoint checkpoint(s.dir.path());
  checkpoint.check(build_layout(checkpoint.config()));
  // mxtrain qkv [48, 16] = c_attn [16, 48] transposed: qkv[r][c] = c_attn[c][r].
  const std::vector<float> qkv = parameter(checkpoint, "layers.0.attn.qkv.weight");
  EXPECT_EQ(qkv[5 * 16 + 3], s.value(p + "attn.c_attn.weight", 3 * 48 + 5));
  const std::vector<float> down = parameter(checkpoint, "layers.0.mlp.down.weight");  // [16, 64] from [64, 16]
  EXPECT_EQ(down[2 * 64 + 40], s.value(p + "mlp.c_proj.weight", 40 * 16 + 2));
  EXPECT_EQ(parameter(checkpoint, "layers.0.mlp.up.bias")[9], s.value(p + "mlp.c_fc.bias", 9));
  EXPECT_EQ(parameter(checkpoint, "embed.position")[20], s.value("transformer.wpe.weight", 20));
}

TEST(HfCheckpoint, MissingMisshapedAndUnknownTensorsAreListed) {
  Synthetic s;
  fill_llama(s, false);
  s.shapes.erase("model.layers.1.self_attn.v_proj.weight");
  s.shapes["model.layers.0.mlp.down_proj.weight"] = {24, 16};
  s.add("model.layers.0.self_attn.q_norm.weight", {4});
  s.write(llama_json());
  HfCheckpoint checkpoint(s.dir.path());
  const std::string message = error_of([&] { checkpoint.check(build_layout(checkpoint.config())); });
  EXPECT_NE(message.find("missing model.layers.1.self_attn.v_proj.weight"), std::string::npos) << message;
  EXPECT_NE(message.find("model.layers.0.mlp.down_proj.weight is [24, 16], expected [16, 24]"), std::string::npos)
      << message;
  EXPECT_NE(message.find("unexpected tensor model.layers.0.self_attn.q_norm.weight"), std::string::npos) << message;
}

TEST(HfCheckpoint, ADirectoryWithoutWeightsSaysWhatIsMissing) {
  test::TempDir dir;
  std::ofstream(dir.file("config.json")) << llama_json().dump();
  EXPECT_NE(error_of([&] { HfCheckpoint checkpoint(dir.path()); }).find("model.safetensors"), std::string::npos);
  std::ofstream(dir.file("config.json")) << "{not json";
  EXPECT_NE(error_of([&] { HfCheckpoint checkpoint(dir.path()); }).find("config.json"), std::string::npos);
  // A file cut short (a download that stopped): the parser's line and column, and the fix.
  const std::string text = llama_json().dump(2);
  std::ofstream(dir.file("config.json"), std::ios::trunc) << text.substr(0, text.size() / 2);
  const std::string message = error_of([&] { HfCheckpoint checkpoint(dir.path()); });
  EXPECT_NE(message.find("config.json is not valid JSON (parse error at line "), std::string::npos) << message;
  EXPECT_NE(message.find("copy it again"), std::string::npos) << message;
  EXPECT_EQ(message.find("[json.exception"), std::string::npos) << message;
  // The bytes the parser quotes from a damaged file come out escaped: the message is printable.
  std::ofstream(dir.file("config.json"), std::ios::trunc) << "{\"model_type\": \"ll\xff\x01" << std::string(500, 'a');
  const std::string damaged = error_of([&] { HfCheckpoint checkpoint(dir.path()); });
  EXPECT_NE(damaged.find("\\xff"), std::string::npos) << damaged;
  for (const char c : damaged)
    EXPECT_TRUE(c == '\n' || (static_cast<unsigned char>(c) >= 0x20 && static_cast<unsigned char>(c) < 0x7f)) << damaged;
  EXPECT_LT(damaged.size(), 600u) << damaged;
}

}  // namespace
}  // namespace mxtrain::interop
