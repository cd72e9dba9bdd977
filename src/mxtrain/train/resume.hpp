// Where a run starts: from step 0, or from the newest checkpoint of its run directory that every
// rank could load (checkpoint.resume = auto or always), after checking that the checkpoint holds
// the same model, warning about training settings that changed, and putting the data loader back
// where the checkpointed run stopped. A checkpoint saved by another world size or strategy loads
// resharded.
#pragma once
#include <cstdint>
#include <string>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/data/loader.hpp"
#include "mxtrain/model/parameters.hpp"
#include "mxtrain/train/checkpoint.hpp"
#include "mxtrain/train/rank_group.hpp"

namespace mxtrain {

struct ResumePoint {
  int64_t step = 0;    // the last step done; the run continues with step + 1
  int64_t tokens = 0;  // tokens trained on so far
  nlohmann::json extra = nlohmann::json::object();  // the checkpoint's precision state (CheckpointMeta::extra)
};

// Collective: every rank calls it. Loads the checkpoint into `params`, this rank's resume state
// into `state` (CheckpointStore::load) and the sampler position into `loader`; throws
// Error(checkpoint) with advice when checkpoint.resume forbids what the directory holds, when no
// checkpoint loads, or when the model differs.
ResumePoint resume_run(const RunConfig& config, int world_size, CheckpointStore& checkpoints, ParameterStore& params,
                       const NamedBuffers& state, Backend& backend, data::TrainLoader& loader,
                       const RankGroup& ranks);

}  // namespace mxtrain
