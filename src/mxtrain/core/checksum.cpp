#include "mxtrain/core/checksum.hpp"

#include <array>
#include <cstring>

namespace mxtrain {
namespace {

using Tables = std::array<std::array<uint32_t, 256>, 8>;

Tables make_tables() {
  Tables tables{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t crc = i;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    tables[0][i] = crc;
  }
  for (uint32_t i = 0; i < 256; ++i)
    for (size_t t = 1; t < 8; ++t) tables[t][i] = (tables[t - 1][i] >> 8) ^ tables[0][tables[t - 1][i] & 0xffu];
  return tables;
}

const Tables& tables() {
  static const Tables instance = make_tables();
  return instance;
}

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* data, size_t bytes) {
  const Tables& t = tables();
  const auto* p = static_cast<const unsigned char*>(data);
  crc = ~crc;
  while (bytes >= 8) {
    uint32_t low, high;
    std::memcpy(&low, p, 4);
    std::memcpy(&high, p + 4, 4);
    low ^= crc;
    crc = t[7][low & 0xff] ^ t[6][(low >> 8) & 0xff] ^ t[5][(low >> 16) & 0xff] ^ t[4][low >> 24] ^
          t[3][high & 0xff] ^ t[2][(high >> 8) & 0xff] ^ t[1][(high >> 16) & 0xff] ^ t[0][high >> 24];
    p += 8;
    bytes -= 8;
  }
  while (bytes--) crc = (crc >> 8) ^ t[0][(crc ^ *p++) & 0xffu];
  return ~crc;
}

}  // namespace mxtrain
