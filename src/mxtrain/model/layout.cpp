#include "mxtrain/model/layout.hpp"

#include <algorithm>
#include <cmath>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

int ParamGroup::find(const std::string& param_name) const {
  for (size_t i = 0; i < params.size(); ++i)
    if (params[i].name == param_name) return static_cast<int>(i);
  return -1;
}

int64_t ModelLayout::parameter_count() const {
  int64_t total = 0;
  for (const ParamGroup& group : groups) total += group.numel;
  return total;
}

bool ModelLayout::locate(const std::string& param_name, int* group, int* index) const {
  for (size_t g = 0; g < groups.size(); ++g) {
    int found = groups[g].find(param_name);
    if (found >= 0) {
      *group = static_cast<int>(g);
      *index = found;
      return true;
    }
  }
  return false;
}

namespace {

// Adds decayed params first, then the rest, assigning offsets; returns the index of each
// added spec in the order given.
std::vector<int> finish_group(ParamGroup& group, std::vector<ParamSpec> specs) {
  std::vector<int> index_of(specs.size(), -1);
  for (int pass = 0; pass < 2; ++pass) {
    for (size_t i = 0; i < specs.size(); ++i) {
      if (specs[i].decay != (pass == 0)) continue;
      specs[i].offset = group.numel;
      group.numel += specs[i].numel();
      if (pass == 0) group.decay_numel = group.numel;
      index_of[i] = static_cast<int>(group.params.size());
      group.params.push_back(specs[i]);
    }
  }
  return index_of;
}

ParamSpec matrix(const std::string& name, int64_t rows, int64_t cols, InitKind init = InitKind::normal) {
  return ParamSpec{name, Shape{rows, cols}, init, true, 0};
}
ParamSpec vector(const std::string& name, int64_t size, InitKind init) {
  return ParamSpec{name, Shape{size}, init, false, 0};
}

}  // namespace

ModelLayout build_layout(const ModelConfig& config) {
  config.validate();
  ModelLayout layout;
  const int64_t C = config.hidden;
  const bool gpt2 = config.family == ModelFamily::gpt2;

  ParamGroup embed{"embed", {}, 0, 0};
  std::vector<ParamSpec> embed_specs{matrix("embed.token", config.padded_vocab, C)};
  if (gpt2) embed_specs.push_back(matrix("embed.position", config.max_seq_len, C));
  std::vector<int> embed_index = finish_group(embed, embed_specs);
  layout.token_table = embed_index[0];
  if (gpt2) layout.position_table = embed_index[1];
  layout.groups.push_back(embed);
  layout.first_layer_group = 1;

  for (int64_t l = 0; l < config.layers; ++l) {
    std::string p = "layers." + std::to_string(l) + ".";
    std::vector<ParamSpec> specs;
    enum Slot { qkv_w, out_w, up_w, down_w, n1_w, n2_w, n1_b, n2_b, qkv_b, out_b, up_b, down_b, slot_count };
    std::vector<int> slot_of(slot_count, -1);
    auto add = [&](Slot slot, ParamSpec spec) {
      slot_of[slot] = static_cast<int>(specs.size());
      specs.push_back(std::move(spec));
    };
    add(qkv_w, matrix(p + "attn.qkv.weight", config.qkv_cols(), C));
    add(out_w, matrix(p + "attn.out.weight", C, C, InitKind::normal_residual));
    add(up_w, matrix(p + "mlp.up.weight", config.up_cols(), C));
    add(down_w, matrix(p + "mlp.down.weight", C, config.ffn_hidden, InitKind::normal_residual));
    add(n1_w, vector(p + "attn_norm.weight", C, InitKind::ones));
    add(n2_w, vector(p + "mlp_norm.weight", C, InitKind::ones));
    if (gpt2) {
      add(n1_b, vector(p + "attn_norm.bias", C, InitKind::zeros));
      add(n2_b, vector(p + "mlp_norm.bias", C, InitKind::zeros));
    }
    if (config.has_qkv_bias()) add(qkv_b, vector(p + "attn.qkv.bias", config.qkv_cols(), InitKind::zeros));
    if (config.bias) {
      add(out_b, vector(p + "attn.out.bias", C, InitKind::zeros));
      add(up_b, vector(p + "mlp.up.bias", config.up_cols(), InitKind::zeros));
      add(down_b, vector(p + "mlp.down.bias", C, InitKind::zeros));
    }
    ParamGroup group{"layers." + std::to_string(l), {}, 0, 0};
    std::vector<int> index = finish_group(group, specs);
    auto at = [&](Slot slot) { return slot_of[slot] < 0 ? -1 : index[static_cast<size_t>(slot_of[slot])]; };
    LayerParamIndex& li = layout.layer;
    li.qkv_weight = at(qkv_w);
    li.out_weight = at(out_w);
    li.up_weight = at(up_w);
    li.down_weight = at(down_w);
    li.attn_norm_weight = at(n1_w);
    li.mlp_norm_weight = at(n2_w);
    li.attn_norm_bias = at(n1_b);
    li.mlp_norm_bias = at(n2_b);
    li.qkv_bias = at(qkv_b);
    li.out_bias = at(out_b);
    li.up_bias = at(up_b);
    li.down_bias = at(down_b);
    layout.groups.push_back(group);
  }

  ParamGroup head{"head", {}, 0, 0};
  std::vector<ParamSpec> head_specs{vector("final_norm.weight", C, InitKind::ones)};
  if (gpt2) head_specs.push_back(vector("final_norm.bias", C, InitKind::zeros));
  if (!config.tied_embeddings) head_specs.push_back(matrix("head.weight", config.padded_vocab, C));
  std::vector<int> head_index = finish_group(head, head_specs);
  layout.final_norm_weight = head_index[0];
  if (gpt2) layout.final_norm_bias = head_index[1];
  if (!config.tied_embeddings) layout.head_weight = head_index.back();
  layout.head_group = static_cast<int>(layout.groups.size());
  layout.groups.push_back(head);
  MXTRAIN_ASSERT(layout.parameter_count() == config.parameter_count(), "layout %lld vs config %lld params",
                 static_cast<long long>(layout.parameter_count()), static_cast<long long>(config.parameter_count()));
  return layout;
}

namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

uint64_t hash_name(const std::string& name) {
  uint64_t hash = 1469598103934665603ull;  // FNV-1a
  for (unsigned char c : name) hash = (hash ^ c) * 1099511628211ull;
  return hash;
}

}  // namespace

namespace {

double init_std(const ModelConfig& config, const ParamSpec& spec) {
  double std = config.init_std;
  if (spec.init == InitKind::normal_residual) std /= std::sqrt(2.0 * static_cast<double>(config.layers));
  return std;
}

// Box-Muller on two uniforms drawn from a counter-based hash of (seed, name, index); `name_key`
// is splitmix64(seed ^ hash_name(name)).
float normal_value(uint64_t name_key, double std, int64_t index) {
  const uint64_t key = name_key ^ static_cast<uint64_t>(index) * 0xd1342543de82ef95ull;
  const uint64_t r1 = splitmix64(key);
  const uint64_t r2 = splitmix64(r1 ^ 0x5851f42d4c957f2dull);
  const double u1 = (static_cast<double>(r1 >> 11) + 1.0) * 0x1.0p-53;  // (0, 1]
  const double u2 = static_cast<double>(r2 >> 11) * 0x1.0p-53;          // [0, 1)
  const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
  return static_cast<float>(z * std);
}

}  // namespace

void initial_values(const ModelConfig& config, const ParamSpec& spec, uint64_t seed, int64_t begin, int64_t count,
                    float* out) {
  if (spec.init == InitKind::ones || spec.init == InitKind::zeros) {
    std::fill(out, out + count, spec.init == InitKind::ones ? 1.0f : 0.0f);
    return;
  }
  const uint64_t name_key = splitmix64(seed ^ hash_name(spec.name));
  const double std = init_std(config, spec);
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) out[i] = normal_value(name_key, std, begin + i);
}

ParameterValues random_initialization(const ModelConfig& config, uint64_t seed) {
  return [config, seed](const ParamSpec& spec, int64_t begin, int64_t count, float* out) {
    initial_values(config, spec, seed, begin, count, out);
  };
}

}  // namespace mxtrain
