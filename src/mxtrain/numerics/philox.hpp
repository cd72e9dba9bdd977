// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC 2011), with the
// Random123 constants, and the one mapping from (seed, stream offset, element index) to the 32-bit
// random word that stochastic rounding consumes. A counter-based generator has no state to carry
// between threads: any thread that knows an element's index computes its word, so the CPU
// reference and a CUDA kernel with any thread layout produce the same bits.
#pragma once
#include <cstdint>

#include "mxtrain/numerics/host_device.hpp"

namespace mxtrain::numerics {

struct PhiloxBlock {
  uint32_t word[4];
};

constexpr uint32_t kPhiloxMultiplier0 = 0xD2511F53u;
constexpr uint32_t kPhiloxMultiplier1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxKeyStep0 = 0x9E3779B9u;  // golden ratio
constexpr uint32_t kPhiloxKeyStep1 = 0xBB67AE85u;  // sqrt(3) - 1
constexpr int kPhiloxRounds = 10;

// Counter (4 words) and key (2 words) to 4 random words, as Random123's philox4x32_R(10, ...):
// round 0 uses the key as given, and the key is bumped by the Weyl steps before each later round.
MXTRAIN_HD inline PhiloxBlock philox4x32_10(PhiloxBlock counter, uint32_t key0, uint32_t key1) {
  for (int round = 0; round < kPhiloxRounds; ++round) {
    if (round > 0) {
      key0 += kPhiloxKeyStep0;
      key1 += kPhiloxKeyStep1;
    }
    const uint64_t product0 = static_cast<uint64_t>(kPhiloxMultiplier0) * counter.word[0];
    const uint64_t product1 = static_cast<uint64_t>(kPhiloxMultiplier1) * counter.word[2];
    const uint32_t high0 = static_cast<uint32_t>(product0 >> 32), low0 = static_cast<uint32_t>(product0);
    const uint32_t high1 = static_cast<uint32_t>(product1 >> 32), low1 = static_cast<uint32_t>(product1);
    counter = PhiloxBlock{{high1 ^ counter.word[1] ^ key0, low1, high0 ^ counter.word[3] ^ key1, low0}};
  }
  return counter;
}

// The random word of element `index` in the stream (seed, offset):
//   key     = {low 32 bits of seed, high 32 bits of seed}
//   counter = {low and high 32 bits of index / 4, low and high 32 bits of offset}
//   word    = philox4x32_10(counter, key).word[index % 4]
// so each Philox call serves 4 consecutive elements. `offset` separates the streams that share a
// seed (for example step * tensors + tensor id): a different offset gives an unrelated stream.
MXTRAIN_HD inline uint32_t philox_random_word(uint64_t seed, uint64_t offset, uint64_t index) {
  const uint64_t group = index >> 2;
  const PhiloxBlock counter{{static_cast<uint32_t>(group), static_cast<uint32_t>(group >> 32),
                             static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}};
  const PhiloxBlock block =
      philox4x32_10(counter, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  return block.word[index & 3u];
}

}  // namespace mxtrain::numerics
