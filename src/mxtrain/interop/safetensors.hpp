// safetensors, the weight format of Hugging Face checkpoints: an 8-byte little-endian header
// length N, N bytes of JSON naming each tensor's dtype, shape and [begin, end) byte range in the
// data area that follows, then the raw little-endian bytes. docs/huggingface.md describes it.
//
// The reader trusts nothing in a file: every header field is checked against the others and
// against the file's size before any buffer is sized from it (the ranges must tile the data
// area exactly, as the reference reader demands), and tensors are read by range with pread, so
// a rank can load just its shard of a large model. The writer streams tensors in header order
// into PATH.tmp and renames it into place only when every byte is written and flushed.
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mxtrain/core/dtype.hpp"

namespace mxtrain::interop {

// The largest header accepted (the reference reader's limit is 100 MB as well).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100u << 20;

struct SafetensorsTensor {
  std::string name;
  std::string dtype;            // "F32", "BF16", "F16", "I32", ... as the file says
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range in the data area
  int64_t numel() const;
};

// Bytes of one element of a safetensors dtype; 0 when the dtype is unknown.
int safetensors_element_bytes(const std::string& dtype);
// The safetensors name of an mxtrain dtype (f32 → "F32", ...); throws for dtypes it cannot hold.
std::string safetensors_dtype(DType dtype);
// The mxtrain dtype of a safetensors dtype, if mxtrain has one.
std::optional<DType> mxtrain_dtype(const std::string& safetensors_dtype);

class SafetensorsReader {
 public:
  // Opens and validates `path`; throws Error(data) naming the file and the broken field.
  explicit SafetensorsReader(const std::string& path);
  ~SafetensorsReader();
  SafetensorsReader(const SafetensorsReader&) = delete;
  SafetensorsReader& operator=(const SafetensorsReader&) = delete;

  const std::string& path() const { return path_; }
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // nullptr when absent.
  const SafetensorsTensor* find(const std::string& name) const;

  // Raw bytes [offset, offset + bytes) of a tensor's data.
  void read_bytes(const SafetensorsTensor& tensor, uint64_t offset, uint64_t bytes, void* out) const;
  // Elements [first, first + count) of an F32, BF16 or F16 tensor, widened to f32 exactly.
  void read_f32(const SafetensorsTensor& tensor, int64_t first, int64_t count, float* out) const;

 private:
  std::string path_;
  int descriptor_ = -1;
  uint64_t data_start_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// Writes one safetensors file. Declare every tensor up front (the header comes first), then
// append each tensor's bytes in the declared order, then commit(). Until commit() returns the
// file at `path` is untouched; a writer destroyed before that removes its temporary.
class SafetensorsWriter {
 public:
  struct Declaration {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
  };
  SafetensorsWriter(std::string path, const std::vector<Declaration>& tensors,
                    const std::map<std::string, std::string>& metadata = {});
  ~SafetensorsWriter();
  SafetensorsWriter(const SafetensorsWriter&) = delete;
  SafetensorsWriter& operator=(const SafetensorsWriter&) = delete;

  // The declared tensors' bytes, in declaration order, in pieces of any size.
  void append(const void* data, uint64_t bytes);
  void commit();
  // Header plus data: the file's size once committed.
  uint64_t file_bytes() const { return header_bytes_ + data_bytes_; }

 private:
  void fail(const std::string& what);

  std::string path_, temporary_;
  int descriptor_ = -1;
  uint64_t written_ = 0, header_bytes_ = 0, data_bytes_ = 0;
  bool committed_ = false;
};

}  // namespace mxtrain::interop
