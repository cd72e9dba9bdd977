// The parameter table: every weight declared once, with name, shape, initialisation and
// whether it gets weight decay, grouped into flat groups — one for the embeddings, one per
// transformer block, one for the final norm and head. A group is the unit of FSDP (one flat
// parameter per block), of the optimizer's multi-tensor update and of checkpoints. Inside a
// group the decayed matrices come first, so "decay elements [0, decay_numel)" is one range.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "mxtrain/core/tensor.hpp"
#include "mxtrain/model/config.hpp"

namespace mxtrain {

enum class InitKind : uint8_t { normal, normal_residual, ones, zeros };

struct ParamSpec {
  std::string name;   // "layers.3.attn.qkv.weight"
  Shape shape;
  InitKind init = InitKind::normal;
  bool decay = true;
  int64_t offset = 0;  // elements from the start of its group
  int64_t numel() const { return shape.numel(); }
};

struct ParamGroup {
  std::string name;  // "embed", "layers.3", "head"
  std::vector<ParamSpec> params;
  int64_t numel = 0;
  int64_t decay_numel = 0;
  int find(const std::string& param_name) const;  // index or -1
};

// Indices of the parameters of a block inside its group (-1 when absent in this family).
struct LayerParamIndex {
  int attn_norm_weight = -1, attn_norm_bias = -1, qkv_weight = -1, qkv_bias = -1, out_weight = -1, out_bias = -1;
  int mlp_norm_weight = -1, mlp_norm_bias = -1, up_weight = -1, up_bias = -1, down_weight = -1, down_bias = -1;
};

struct ModelLayout {
  std::vector<ParamGroup> groups;
  int embed_group = 0;
  int first_layer_group = 1;
  int head_group = 0;
  int token_table = -1, position_table = -1;            // in the embed group
  int final_norm_weight = -1, final_norm_bias = -1, head_weight = -1;  // in the head group (head_weight -1 if tied)
  LayerParamIndex layer;                                // same indices in every block's group
  int layer_group(int64_t layer_index) const { return first_layer_group + static_cast<int>(layer_index); }
  // Whether `group` holds a transformer block (not the embedding or the head).
  bool is_layer_group(int group) const { return group >= first_layer_group && group < head_group; }
  int64_t parameter_count() const;
  // Finds "group/param" by full parameter name; false when absent.
  bool locate(const std::string& param_name, int* group, int* index) const;
};

ModelLayout build_layout(const ModelConfig& config);

// The initial values of elements [begin, begin+count) of parameter `spec` into out
// (multithreaded). Each is a pure function of (seed, name, index): any rank can initialise any
// shard of any parameter without the others.
void initial_values(const ModelConfig& config, const ParamSpec& spec, uint64_t seed, int64_t begin, int64_t count,
                    float* out);

// Where a parameter's values come from, element range by element range: initial_values for a
// seed, a Hugging Face checkpoint (interop/hf_checkpoint.hpp), a native checkpoint (export).
using ParameterValues = std::function<void(const ParamSpec& spec, int64_t begin, int64_t count, float* out)>;
ParameterValues random_initialization(const ModelConfig& config, uint64_t seed);

}  // namespace mxtrain
