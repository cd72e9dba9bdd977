// A native checkpoint → a Hugging Face model directory: the checkpoint's config and master
// weights through interop/hf_export.hpp, with the run's tokenizer files and its BOS/EOS ids.
// `mxtrain export` and the end of a SageMaker job (SM_MODEL_DIR) both call it.
#pragma once
#include <cstdint>
#include <string>

#include "mxtrain/core/dtype.hpp"
#include "mxtrain/interop/hf_export.hpp"
#include "mxtrain/model/config.hpp"

namespace mxtrain {

struct CheckpointExport {
  std::string checkpoint;  // the checkpoint directory read
  int64_t step = 0;
  ModelFamily family = ModelFamily::llama;
  interop::HfExportResult result;
};

// `source`: a run directory (its newest complete checkpoint) or a checkpoint directory. dtype:
// bf16 or f32. Throws Error(checkpoint) for a missing or damaged checkpoint, Error(config) for
// another dtype, and what export_hf throws for the output directory.
CheckpointExport export_checkpoint_to_hf(const std::string& source, const std::string& out_dir, DType dtype,
                                         uint64_t max_shard_bytes);

}  // namespace mxtrain
