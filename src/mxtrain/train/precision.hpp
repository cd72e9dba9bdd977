// The precision recipe of a run, resolved once from train.precision and the device: which dtype
// activations, compute weights and gradients use, and the start-up line that says so.
#pragma once
#include <string>

#include "mxtrain/core/dtype.hpp"

namespace mxtrain {

struct PrecisionPlan {
  std::string name;                  // "fp32", "bf16"
  DType activation = DType::f32;
  DType compute = DType::f32;        // weights as the GEMMs read them
  DType grad = DType::f32;           // gradient accumulation
  std::string startup_line;          // printed at start
};

// device is the resolved device ("cpu" or "cuda"). Throws Error(config) for combinations the
// device cannot run, with the fix.
PrecisionPlan resolve_precision(const std::string& requested, const std::string& device, bool tf32);

}  // namespace mxtrain
