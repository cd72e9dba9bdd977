// Philox4x32-10 against the known-answer vectors of the Random123 distribution (tests/kat_vectors,
// lines "philox4x32 10 ..."; counter, key, expected output), and the element-index mapping.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <set>

#include "mxtrain/numerics/philox.hpp"

namespace mxtrain::numerics {
namespace {

void expect_block(const PhiloxBlock& got, uint32_t a, uint32_t b, uint32_t c, uint32_t d) {
  EXPECT_EQ(got.word[0], a);
  EXPECT_EQ(got.word[1], b);
  EXPECT_EQ(got.word[2], c);
  EXPECT_EQ(got.word[3], d);
}

TEST(Philox, KnownAnswerZeros) {
  expect_block(philox4x32_10(PhiloxBlock{{0, 0, 0, 0}}, 0, 0), 0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u);
}

TEST(Philox, KnownAnswerAllOnes) {
  const uint32_t ones = 0xffffffffu;
  expect_block(philox4x32_10(PhiloxBlock{{ones, ones, ones, ones}}, ones, ones), 0x408f276du, 0x41c83b0eu,
               0xa20bc7c6u, 0x6d5451fdu);
}

TEST(Philox, KnownAnswerPiDigits) {
  expect_block(philox4x32_10(PhiloxBlock{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}}, 0xa4093822u, 0x299f31d0u),
               0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u);
}

TEST(Philox, RandomWordLayout) {
  // index = 4g + j reads word j of the block with counter {g_lo, g_hi, offset_lo, offset_hi} and
  // key {seed_lo, seed_hi}.
  const uint64_t seed = 0x0123456789abcdefull;
  const uint64_t offset = 0xfedcba9876543210ull;
  const uint64_t group = 0x0000000500000003ull;
  const PhiloxBlock block = philox4x32_10(PhiloxBlock{{0x00000003u, 0x00000005u, 0x76543210u, 0xfedcba98u}},
                                          0x89abcdefu, 0x01234567u);
  for (uint32_t j = 0; j < 4; ++j) EXPECT_EQ(philox_random_word(seed, offset, group * 4 + j), block.word[j]) << j;
  // Zero seed, offset and index is the first known-answer vector.
  EXPECT_EQ(philox_random_word(0, 0, 0), 0x6627e8d5u);
  EXPECT_EQ(philox_random_word(0, 0, 3), 0x9b00dbd8u);
}

TEST(Philox, StreamsAreReproducibleAndDistinct) {
  std::set<uint32_t> words;
  for (uint64_t index = 0; index < 64; ++index) {
    EXPECT_EQ(philox_random_word(42, 1, index), philox_random_word(42, 1, index));
    words.insert(philox_random_word(42, 1, index));
    words.insert(philox_random_word(42, 2, index));              // another offset
    words.insert(philox_random_word(42 + (1ull << 32), 1, index));  // the seed's high word matters
  }
  EXPECT_EQ(words.size(), 3u * 64u);  // 192 distinct 32-bit words; a collision would be a 4e-6 event
}

TEST(Philox, WordsLookUniform) {
  // Mean of words / 2^32 over 2^18 draws within 5 standard errors of 1/2, and every bit set about
  // half the time.
  constexpr int kDraws = 1 << 18;
  double sum = 0;
  int bit_counts[32] = {};
  for (int i = 0; i < kDraws; ++i) {
    const uint32_t word = philox_random_word(7, 0, static_cast<uint64_t>(i));
    sum += word / 4294967296.0;
    for (int bit = 0; bit < 32; ++bit) bit_counts[bit] += (word >> bit) & 1u;
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 5 * std::sqrt(1.0 / 12 / kDraws));
  for (int bit = 0; bit < 32; ++bit) EXPECT_NEAR(bit_counts[bit], kDraws / 2, 5 * std::sqrt(kDraws / 4.0)) << bit;
}

}  // namespace
}  // namespace mxtrain::numerics
