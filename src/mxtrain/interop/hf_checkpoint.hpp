// A Hugging Face checkpoint directory (config.json + model.safetensors, or shards listed in
// model.safetensors.index.json) as mxtrain sees it: the ModelConfig it describes, and the value of
// any element range of any mxtrain parameter, read straight from the safetensors files. The last
// is the same contract as model/layout.hpp's initial_values, so a store that can initialise a
// shard of a parameter can load it from a checkpoint without a full copy of the model anywhere.
//
// The name and layout mapping (docs/huggingface.md has the tables): Llama's q/k/v projections
// stack into qkv rows, gate/up into the up rows (gate first); GPT-2's Conv1D weights are stored
// transposed ([in, out]); the vocabulary is padded with zero rows to the model's padded size.
// Anything mxtrain would not compute exactly is refused with the field's name.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/config/run_config.hpp"
#include "mxtrain/interop/safetensors.hpp"
#include "mxtrain/model/config.hpp"
#include "mxtrain/model/layout.hpp"

namespace mxtrain::interop {

// config.json → ModelConfig (preset "hf:<model_type>"). Throws Error(config) naming the field
// when the architecture or a setting cannot be reproduced exactly; `origin` names the file.
ModelConfig model_config_from_hf(const nlohmann::json& config, const std::string& origin);

// With model.init_from set: the model's shape from DIR/config.json (the weights load later, into
// the parameter store). A model.* key the run sets away from its preset must agree with the file,
// else Error(config) names both values; model.padded_vocab may widen the padding.
void apply_init_from(RunConfig& config);

// ModelConfig → config.json for `transformers` (LlamaForCausalLM or GPT2LMHeadModel).
nlohmann::json hf_config_from_model(const ModelConfig& config, int bos_token_id, int eos_token_id);

// Where one mxtrain parameter comes from: rows of one or more Hugging Face tensors, stacked in
// order, each possibly stored transposed; or (interleaved) taking turns row by row: llama's
// mlp.up.weight is gate_proj's row j at row 2j and up_proj's row j at row 2j + 1, the order the
// fused SwiGLU reads its pre-activation in (model/layout.hpp).
struct HfSource {
  struct Part {
    std::string tensor;    // Hugging Face name
    int64_t rows = 0;      // rows of the mxtrain parameter this part fills
    bool transposed = false;
  };
  std::vector<Part> parts;  // rows of the parameter past the parts' total are zero (vocabulary padding)
  bool interleaved = false;  // parts of equal rows, not transposed, row r from part r % n's row r / n
};

// The mapping for one mxtrain parameter of `config` (name as in the layout).
HfSource hf_source(const ModelConfig& config, const ParamSpec& spec);

class HfCheckpoint {
 public:
  // Reads DIR/config.json and opens DIR/model.safetensors or the shards of
  // DIR/model.safetensors.index.json; throws Error(config|data) naming the file.
  explicit HfCheckpoint(const std::string& directory);

  const std::string& directory() const { return directory_; }
  const ModelConfig& config() const { return config_; }
  const nlohmann::json& config_json() const { return config_json_; }

  // Checks that every tensor the layout needs is present with the right shape and dtype, and
  // that no tensor is left unused (a tied head's lm_head copy excepted); throws Error(data)
  // listing what is missing, mis-shaped or unknown.
  void check(const ModelLayout& layout) const;

  // Elements [begin, begin + count) of parameter `spec` (row-major over its mxtrain shape), in f32.
  void values(const ParamSpec& spec, int64_t begin, int64_t count, float* out) const;
  // values() as a store's source of initial weights (valid while this checkpoint lives).
  ParameterValues parameter_values() const;

 private:
  const SafetensorsTensor& tensor(const std::string& name, const SafetensorsReader** reader) const;

  std::string directory_;
  nlohmann::json config_json_;
  ModelConfig config_;
  std::vector<std::unique_ptr<SafetensorsReader>> files_;
  std::map<std::string, std::pair<const SafetensorsReader*, const SafetensorsTensor*>> tensors_;
};

}  // namespace mxtrain::interop
