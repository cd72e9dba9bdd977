#include "mxtrain/report/tensorboard.hpp"

#include <unistd.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

namespace {

const std::array<uint32_t, 256>& crc32c_table() {
  static const std::array<uint32_t, 256> table = [] {
    std::array<uint32_t, 256> t{};
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t crc = i;
      for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
      t[i] = crc;
    }
    return t;
  }();
  return table;
}

// Protobuf wire format: varints, and keys (field << 3 | wire type).
void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out.push_back(static_cast<char>((value & 0x7f) | 0x80));
    value >>= 7;
  }
  out.push_back(static_cast<char>(value));
}
void put_key(std::string& out, int field, int wire_type) { put_varint(out, static_cast<uint64_t>(field << 3 | wire_type)); }
template <typename T>
void put_fixed(std::string& out, T value) {
  char bytes[sizeof(T)];
  std::memcpy(bytes, &value, sizeof(T));  // little-endian hosts only (x86-64, arm64)
  out.append(bytes, sizeof(T));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_key(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

// Event{wall_time = 1, step = 2}, the fields every record has.
std::string event_header(double wall_time, int64_t step) {
  std::string event;
  put_key(event, 1, 1);
  put_fixed(event, wall_time);
  put_key(event, 2, 0);
  put_varint(event, static_cast<uint64_t>(step));
  return event;
}

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

constexpr std::string_view kEventFilePrefix = "events.out.tfevents.";

// The seconds of an event file's name (events.out.tfevents.<seconds>.<host>.<pid>), or -1.
long long seconds_of_event_file(const std::string& name) {
  if (name.rfind(kEventFilePrefix, 0) != 0) return -1;
  long long seconds = 0;
  size_t i = kEventFilePrefix.size();
  const size_t first_digit = i;
  for (; i < name.size() && name[i] >= '0' && name[i] <= '9' && i - first_digit < 18; ++i)
    seconds = seconds * 10 + (name[i] - '0');
  return i > first_digit ? seconds : -1;
}

// Now in whole seconds, or one more than the newest event file of `directory` when that is not
// earlier: readers load the files in name order, and a resumed run's file must come last.
long long event_file_seconds(const std::string& directory) {
  long long seconds = static_cast<long long>(now_seconds());
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(directory, error)) {
    const long long existing = seconds_of_event_file(entry.path().filename().string());
    if (existing >= seconds) seconds = existing + 1;
  }
  return seconds;
}

}  // namespace

uint32_t crc32c(const void* data, size_t bytes) {
  const auto& table = crc32c_table();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t crc = ~0u;
  for (size_t i = 0; i < bytes; ++i) crc = table[(crc ^ p[i]) & 0xffu] ^ (crc >> 8);
  return ~crc;
}

uint32_t masked_crc32c(const void* data, size_t bytes) {
  const uint32_t crc = crc32c(data, bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

TensorBoardWriter::TensorBoardWriter(const std::string& directory) {
  std::error_code error;
  std::filesystem::create_directories(directory, error);
  char host[256] = "host";
  ::gethostname(host, sizeof host - 1);
  path_ = directory + "/" + std::string(kEventFilePrefix) +
          strf("%lld.%s.%d", event_file_seconds(directory), host, static_cast<int>(::getpid()));
  file_ = std::fopen(path_.c_str(), "wbe");
  if (!file_)
    throw Error(ErrorKind::system, "cannot create the TensorBoard file " + path_ + ": " + std::strerror(errno),
                "check that the run directory is writable and has free space, or set log.tensorboard = false");
  std::string event = event_header(now_seconds(), 0);
  put_bytes(event, 3, "brain.Event:2");
  write_record(event);
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_) std::fclose(file_);
}

TensorBoardWriter::TensorBoardWriter(TensorBoardWriter&& other) noexcept
    : path_(std::move(other.path_)), file_(other.file_) {
  other.file_ = nullptr;
}

TensorBoardWriter& TensorBoardWriter::operator=(TensorBoardWriter&& other) noexcept {
  if (this != &other) {
    if (file_) std::fclose(file_);
    path_ = std::move(other.path_);
    file_ = other.file_;
    other.file_ = nullptr;
  }
  return *this;
}

void TensorBoardWriter::add_scalar(std::string_view tag, int64_t step, double value, double wall_time) {
  if (!file_) return;
  std::string summary_value;
  put_bytes(summary_value, 1, tag);
  put_key(summary_value, 2, 5);
  put_fixed(summary_value, static_cast<float>(value));
  std::string summary;
  put_bytes(summary, 1, summary_value);
  std::string event = event_header(wall_time > 0 ? wall_time : now_seconds(), step);
  put_bytes(event, 5, summary);
  write_record(event);
}

void TensorBoardWriter::add_session_start(int64_t step, double wall_time) {
  if (!file_) return;
  std::string session_log;
  put_key(session_log, 1, 0);
  put_varint(session_log, 1);  // SessionLog.status = START
  std::string event = event_header(wall_time > 0 ? wall_time : now_seconds(), step);
  put_bytes(event, 7, session_log);  // Event.session_log (6 is the deprecated log_message)
  write_record(event);
}

void TensorBoardWriter::write_record(const std::string& event) {
  std::string record;
  put_fixed(record, static_cast<uint64_t>(event.size()));
  put_fixed(record, masked_crc32c(record.data(), 8));
  record += event;
  put_fixed(record, masked_crc32c(event.data(), event.size()));
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size() || std::fflush(file_) != 0)
    throw Error(ErrorKind::system, "cannot write the TensorBoard file " + path_ + ": " + std::strerror(errno),
                "free disk space in the run directory, or set log.tensorboard = false");
}

void TensorBoardWriter::flush() {
  if (file_ && std::fflush(file_) != 0)
    throw Error(ErrorKind::system, "cannot write the TensorBoard file " + path_ + ": " + std::strerror(errno),
                "free disk space in the run directory, or set log.tensorboard = false");
}

}  // namespace mxtrain
