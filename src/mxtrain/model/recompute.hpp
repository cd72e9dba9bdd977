// Activation checkpointing as a type. "none" keeps every activation; "selective" drops the
// outputs of norms and of the MLP activation (cheap elementwise work) and recomputes them in
// backward; "full" keeps only each block's input and reruns the block's forward in backward;
// an integer K applies "full" to the first K blocks only (the rest keep everything).
#pragma once
#include <cstdint>
#include <string>

namespace mxtrain {

enum class RecomputeMode : uint8_t { none, selective, full };

struct RecomputePolicy {
  RecomputeMode mode = RecomputeMode::none;
  int64_t full_layers = -1;  // >= 0: "full" for blocks [0, full_layers), "none" after

  // Accepts "none", "selective", "full" or a non-negative integer; throws Error(config).
  static RecomputePolicy parse(const std::string& text);
  std::string str() const;
  RecomputeMode mode_for_layer(int64_t layer) const {
    if (full_layers >= 0) return layer < full_layers ? RecomputeMode::full : RecomputeMode::none;
    return mode;
  }
};

}  // namespace mxtrain
