// What the rotary-embedding ops need to know of the model: the base theta and, for Llama 3.x,
// the frequency scaling. A small header of its own so the model's config can hold one without
// the whole op interface.
#pragma once
#include <cstdint>
#include <vector>

namespace mxtrain {

// RoPE's frequencies: theta, and optionally Llama 3's frequency scaling (Hugging Face rope_type
// "llama3": wavelengths longer than original_max_positions / low_freq_factor are stretched by
// factor, shorter than original_max_positions / high_freq_factor kept, the band between
// interpolated). Implicit from a theta, so callers without scaling pass a float.
struct RopeSpec {
  float theta = 10000.0f;
  float scaling_factor = 0.0f;  // 0: no scaling
  float low_freq_factor = 1.0f, high_freq_factor = 4.0f;
  int64_t original_max_positions = 0;
  RopeSpec() = default;
  RopeSpec(float theta_value) : theta(theta_value) {}  // NOLINT: implicit on purpose
  bool scaled() const { return scaling_factor > 0.0f; }
  bool operator<(const RopeSpec& other) const;  // a key for the backends' table caches
};

// inv_freq[i], i < head_dim / 2, in f32 as torch computes them: 1 / theta^(2i / head_dim), then
// the llama3 scaling where the spec has it (every backend's rotation tables come from here).
std::vector<float> rope_inverse_frequencies(int64_t head_dim, const RopeSpec& spec);

}  // namespace mxtrain
