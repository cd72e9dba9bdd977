// TensorBoard event files, written without TensorFlow or protobuf: a file
// DIR/events.out.tfevents.<seconds>.<host>.<pid> of records, each
//   uint64 length | uint32 masked CRC-32C of the length | length bytes of an Event | uint32 masked CRC-32C of them
// (CRC-32C is the Castagnoli polynomial, not zlib's; masked = rotate right by 15, add 0xa282ead8).
// An Event is a few protobuf fields: wall_time (1, double), step (2, int64), and either
// file_version (3, "brain.Event:2", the first record) or a Summary (5) whose Values carry a tag
// (1) and a simple_value (2, float) — the scalar form every TensorBoard version reads — or a
// SessionLog (7) whose status (1) is START (1).
//
// A resumed run cuts the event files back as TensorFlow's summary writers do: its new file's first
// event after file_version is a SessionLog START at the first step it will write, and TensorBoard's
// reader (EventAccumulator with purge_orphaned_data, the default) then drops every point of the
// earlier files at that step or later. Readers load a directory's files in name order, so a new
// file is named to sort after every event file already there (a crash and a resume within one
// second would otherwise depend on the pids).
//
// Every write is checked: a full disk or a vanished directory is an Error(system) at once, never
// a silently short file.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

namespace mxtrain {

// CRC-32C (Castagnoli), and the masking TensorBoard's record framing applies to it.
uint32_t crc32c(const void* data, size_t bytes);
uint32_t masked_crc32c(const void* data, size_t bytes);

class TensorBoardWriter {
 public:
  TensorBoardWriter() = default;
  // Creates a new event file in `directory` (created if missing), named to sort after the event
  // files already there.
  explicit TensorBoardWriter(const std::string& directory);
  ~TensorBoardWriter();
  TensorBoardWriter(TensorBoardWriter&& other) noexcept;
  TensorBoardWriter& operator=(TensorBoardWriter&& other) noexcept;

  bool is_open() const { return file_ != nullptr; }
  const std::string& path() const { return path_; }
  // One scalar point; wall_time in seconds since the epoch (0: now).
  void add_scalar(std::string_view tag, int64_t step, double value, double wall_time = 0);
  // A SessionLog START at `step`: a reader that purges orphaned data drops every earlier-read point
  // at `step` or later (what a crashed run wrote after the checkpoint a resumed run starts from).
  void add_session_start(int64_t step, double wall_time = 0);
  // Pushes written records to the operating system (each add_scalar is flushed already).
  void flush();

 private:
  void write_record(const std::string& event);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace mxtrain
