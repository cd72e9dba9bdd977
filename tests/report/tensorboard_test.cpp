// The TensorBoard record framing's checksum: CRC-32C (Castagnoli), not zlib's CRC-32, masked.
#include <gtest/gtest.h>

#include <string>

#include "mxtrain/report/tensorboard.hpp"

namespace mxtrain {
namespace {

TEST(TensorBoard, Crc32cIsTheCastagnoliChecksum) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32c(check.data(), check.size()), 0xE3069283u);  // the standard check value
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);  // RFC 3720's 32 zero bytes
}

TEST(TensorBoard, MaskRotatesAndAddsTheConstant) {
  const std::string check = "123456789";
  const uint32_t crc = 0xE3069283u;
  EXPECT_EQ(masked_crc32c(check.data(), check.size()), ((crc >> 15) | (crc << 17)) + 0xa282ead8u);
}

}  // namespace
}  // namespace mxtrain
