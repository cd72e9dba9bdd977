#include "mxtrain/train/checkpoint_export.hpp"

#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/data/tokenizer.hpp"
#include "mxtrain/model/layout.hpp"
#include "mxtrain/train/checkpoint.hpp"

namespace mxtrain {

CheckpointExport export_checkpoint_to_hf(const std::string& source, const std::string& out_dir, DType dtype,
                                         uint64_t max_shard_bytes) {
  if (dtype != DType::bf16 && dtype != DType::f32)
    throw Error(ErrorKind::config, "export dtype " + std::string(dtype_name(dtype)) + " is not bf16 or f32",
                "export in bf16 or f32");
  const CheckpointReader reader(resolve_checkpoint(source));
  const RunConfig config = config_from_json(reader.meta().config);
  const ModelLayout layout = build_layout(config.model);
  interop::HfExportOptions options;
  options.dtype = dtype;
  options.max_shard_bytes = max_shard_bytes;
  options.tokenizer = config.data.tokenizer;
  if (options.tokenizer != "byte") {
    const auto tokenizer = data::make_tokenizer(options.tokenizer);
    options.bos_token_id = tokenizer->bos_id().value_or(0);
    options.eos_token_id = tokenizer->eos_id().value_or(0);
  }
  CheckpointExport exported;
  exported.checkpoint = reader.path();
  exported.step = reader.meta().step;
  exported.family = config.model.family;
  exported.result = interop::export_hf(config.model, reader.master_values(layout), out_dir, options);
  return exported;
}

}  // namespace mxtrain
