// The TensorBoard record framing's checksum: CRC-32C (Castagnoli), not zlib's CRC-32, masked; the
// SessionLog START record a resumed run begins with; event file names that sort in creation order.
// (tests/report/tensorboard_resume.py reads a resumed run's files with TensorBoard's own reader.)
#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include "mxtrain/report/tensorboard.hpp"
#include "support/test_support.hpp"

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

// The events of an event file, each record's framing checked.
std::vector<std::string> read_events(const std::string& path) {
  const std::string bytes = test::read_file(path);
  std::vector<std::string> events;
  size_t at = 0;
  while (at + 12 <= bytes.size()) {
    uint64_t length = 0;
    std::memcpy(&length, bytes.data() + at, 8);
    uint32_t length_crc = 0;
    std::memcpy(&length_crc, bytes.data() + at + 8, 4);
    EXPECT_EQ(length_crc, masked_crc32c(bytes.data() + at, 8));
    if (at + 16 + length > bytes.size()) break;
    events.push_back(bytes.substr(at + 12, length));
    at += 16 + length;
  }
  EXPECT_EQ(at, bytes.size()) << "a record cut short in " << path;
  return events;
}

TEST(TensorBoard, SessionStartIsASessionLogEventAtItsStep) {
  test::TempDir dir;
  TensorBoardWriter writer(dir.path());
  writer.add_session_start(301, 1.5);
  const std::vector<std::string> events = read_events(writer.path());
  ASSERT_EQ(events.size(), 2u);  // file_version, then the START
  std::string expected;
  expected += '\x09';  // wall_time (1, 64-bit)
  const double wall_time = 1.5;
  expected.append(reinterpret_cast<const char*>(&wall_time), 8);
  expected += "\x10\xad\x02";  // step (2, varint) 301
  expected += "\x3a\x02\x08\x01";  // session_log (7, bytes): status (1, varint) START (1)
  EXPECT_EQ(events[1], expected);
}

// Readers load a directory's event files in name order: a new file's name sorts after those
// already there, even when their seconds are ahead of the clock or the same second as now (a
// crash and a resume within one second; before, two writers of one process in one second had
// one name, and the second truncated the first).
TEST(TensorBoard, ANewEventFileSortsAfterTheFilesAlreadyThere) {
  test::TempDir dir;
  const auto now = std::chrono::duration_cast<std::chrono::seconds>(
                       std::chrono::system_clock::now().time_since_epoch()).count();
  const std::string ahead = "events.out.tfevents." + std::to_string(now + 1000) + ".zzzz.99999";
  std::ofstream(dir.file(ahead)) << "";
  TensorBoardWriter first(dir.path());
  TensorBoardWriter second(dir.path());
  const std::string first_name = std::filesystem::path(first.path()).filename().string();
  const std::string second_name = std::filesystem::path(second.path()).filename().string();
  EXPECT_GT(first_name, ahead);
  EXPECT_GT(second_name, first_name);
  EXPECT_EQ(read_events(first.path()).size(), 1u);  // its file_version record, not truncated
}

}  // namespace
}  // namespace mxtrain
