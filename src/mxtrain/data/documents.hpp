// Documents out of the input files of `mxtrain prepare`, one at a time:
//   *.jsonl          one JSON object a line; the document is its `field` (a string); blank lines skip
//   *.jsonl.zst      the same, compressed with zstd (streamed: never decompressed whole)
//   anything else    a text file, which is one document
// Parquet is not read here (Debian 12 has no Arrow C++): scripts/parquet_to_jsonl.py converts it.
// A line that is not a JSON object, or lacks the field, or whose field is not a string, is an
// Error(data) naming the file and the line.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace mxtrain::data {

enum class DocumentFormat { text, jsonl, jsonl_zstd };

// By the file name's ending; throws Error(data) for .parquet with the conversion's command.
DocumentFormat document_format(const std::string& path);

class DocumentReader {
 public:
  DocumentReader(const std::string& path, std::string field);
  ~DocumentReader();
  DocumentReader(const DocumentReader&) = delete;
  DocumentReader& operator=(const DocumentReader&) = delete;

  // The next document, or nothing at the end of the file.
  std::optional<std::string> next();
  // Bytes of the file read so far (compressed bytes for .zst): for progress.
  uint64_t bytes_read() const;

 private:
  struct Source;
  std::string path_, field_;
  DocumentFormat format_;
  std::unique_ptr<Source> source_;
  int64_t line_number_ = 0;
  bool text_done_ = false;
};

}  // namespace mxtrain::data
