#include "mxtrain/data/documents.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"

#ifdef MXTRAIN_HAVE_ZSTD
#include <zstd.h>
#endif

namespace mxtrain::data {

namespace {

bool ends_with(const std::string& text, const std::string& suffix) {
  return text.size() >= suffix.size() && text.compare(text.size() - suffix.size(), suffix.size(), suffix) == 0;
}

[[noreturn]] void unreadable(const std::string& path, const std::string& reason) {
  throw Error(ErrorKind::data, "cannot read input file " + path + ": " + reason,
              "check the path and permissions; mxtrain prepare takes text, .jsonl and .jsonl.zst files");
}

}  // namespace

DocumentFormat document_format(const std::string& path) {
  if (ends_with(path, ".jsonl.zst") || ends_with(path, ".json.zst")) return DocumentFormat::jsonl_zstd;
  if (ends_with(path, ".jsonl")) return DocumentFormat::jsonl;
  if (ends_with(path, ".parquet"))
    throw Error(ErrorKind::data, path + " is parquet, which mxtrain does not read directly (Debian 12 has no Arrow C++)",
                "convert it first: python3 scripts/parquet_to_jsonl.py " + path + " OUT.jsonl --field text "
                "(needs pip install pyarrow), then prepare OUT.jsonl");
  if (ends_with(path, ".zst"))
    throw Error(ErrorKind::data, path + " is zstd-compressed but not .jsonl.zst",
                "decompress it (zstd -d), or name JSON lines files *.jsonl.zst");
  return DocumentFormat::text;
}

// The bytes of one file, as a stream of lines (decompressed for .zst) or whole.
struct DocumentReader::Source {
  std::FILE* file = nullptr;
  uint64_t read = 0;          // raw bytes read from the file
  std::string pending;        // decompressed (or raw) bytes not yet returned as lines
  size_t pending_start = 0;
  bool at_end = false;
#ifdef MXTRAIN_HAVE_ZSTD
  ZSTD_DStream* zstd = nullptr;
  std::vector<char> input = std::vector<char>(ZSTD_DStreamInSize());
  ZSTD_inBuffer in{nullptr, 0, 0};
  size_t last_result = 0;     // 0 when the last frame ended cleanly
#endif
  ~Source() {
    if (file) std::fclose(file);
#ifdef MXTRAIN_HAVE_ZSTD
    if (zstd) ZSTD_freeDStream(zstd);
#endif
  }

  // Appends the next chunk of bytes to `pending`; false at the end of the file.
  bool fill(const std::string& path, bool compressed) {
    if (at_end) return false;
    if (!compressed) {
      char buffer[1 << 16];
      const size_t got = std::fread(buffer, 1, sizeof buffer, file);
      if (got == 0) {
        if (std::ferror(file)) unreadable(path, std::strerror(errno));
        at_end = true;
        return false;
      }
      read += got;
      pending.append(buffer, got);
      return true;
    }
#ifdef MXTRAIN_HAVE_ZSTD
    std::vector<char> output(ZSTD_DStreamOutSize());
    while (true) {
      if (in.pos == in.size) {
        const size_t got = std::fread(input.data(), 1, input.size(), file);
        if (got == 0) {
          if (std::ferror(file)) unreadable(path, std::strerror(errno));
          at_end = true;
          if (last_result != 0)
            throw Error(ErrorKind::data, path + ": the zstd stream ends in the middle of a frame (truncated file)",
                        "copy or download the file again");
          return false;
        }
        read += got;
        in = ZSTD_inBuffer{input.data(), got, 0};
      }
      ZSTD_outBuffer out{output.data(), output.size(), 0};
      last_result = ZSTD_decompressStream(zstd, &out, &in);
      if (ZSTD_isError(last_result))
        throw Error(ErrorKind::data, path + ": not valid zstd data: " + ZSTD_getErrorName(last_result),
                    "copy or download the file again, or check that it is zstd-compressed JSON lines");
      if (out.pos > 0) {
        pending.append(output.data(), out.pos);
        return true;
      }
    }
#else
    throw Error(ErrorKind::unsupported, path + " is zstd-compressed, and this mxtrain was built without zstd",
                "install libzstd-dev (scripts/setup.sh does) and rebuild, or decompress the file first");
#endif
  }

  // The next line without its newline; nothing at the end.
  std::optional<std::string> line(const std::string& path, bool compressed) {
    while (true) {
      const size_t newline = pending.find('\n', pending_start);
      if (newline != std::string::npos) {
        std::string result = pending.substr(pending_start, newline - pending_start);
        pending_start = newline + 1;
        if (pending_start > (1u << 20)) {  // keep the buffer small
          pending.erase(0, pending_start);
          pending_start = 0;
        }
        return result;
      }
      if (!fill(path, compressed)) {
        if (pending_start >= pending.size()) return std::nullopt;
        std::string result = pending.substr(pending_start);
        pending.clear();
        pending_start = 0;
        return result;
      }
    }
  }
};

DocumentReader::DocumentReader(const std::string& path, std::string field)
    : path_(path), field_(std::move(field)), format_(document_format(path)), source_(std::make_unique<Source>()) {
  source_->file = std::fopen(path.c_str(), "rbe");
  if (!source_->file) unreadable(path, std::strerror(errno));
  if (format_ == DocumentFormat::jsonl_zstd) {
#ifdef MXTRAIN_HAVE_ZSTD
    source_->zstd = ZSTD_createDStream();
    ZSTD_initDStream(source_->zstd);
#else
    throw Error(ErrorKind::unsupported, path + " is zstd-compressed, and this mxtrain was built without zstd",
                "install libzstd-dev (scripts/setup.sh does) and rebuild, or decompress the file first");
#endif
  }
}

DocumentReader::~DocumentReader() = default;

uint64_t DocumentReader::bytes_read() const { return source_->read; }

std::optional<std::string> DocumentReader::next() {
  if (format_ == DocumentFormat::text) {
    if (text_done_) return std::nullopt;
    text_done_ = true;
    while (source_->fill(path_, false)) {
    }
    std::string whole = std::move(source_->pending);
    source_->pending.clear();
    return whole;
  }
  const bool compressed = format_ == DocumentFormat::jsonl_zstd;
  while (std::optional<std::string> line = source_->line(path_, compressed)) {
    ++line_number_;
    if (line->find_first_not_of(" \t\r") == std::string::npos) continue;
    const nlohmann::json object = nlohmann::json::parse(*line, nullptr, /*allow_exceptions=*/false);
    const std::string where = strf("%s line %lld", path_.c_str(), static_cast<long long>(line_number_));
    if (object.is_discarded() || !object.is_object())
      throw Error(ErrorKind::data, where + " is not a JSON object", "each line of a .jsonl file holds one JSON object");
    const auto value = object.find(field_);
    if (value == object.end() || !value->is_string()) {
      // The line's string fields are the candidates; with exactly one, it is the fix.
      std::vector<std::string> strings;
      for (const auto& [name, item] : object.items())
        if (item.is_string()) strings.push_back(name);
      std::string listed;
      for (const std::string& name : strings) listed += (listed.empty() ? "\"" : ", \"") + name + "\"";
      const std::string problem = value == object.end() ? " has no field \"" + field_ + "\""
                                                        : ": field \"" + field_ + "\" is not a string";
      throw Error(ErrorKind::data,
                  where + problem + (listed.empty() ? "; it has no string field" : "; its string fields: " + listed),
                  "name the field that holds the text" +
                      (strings.size() == 1 ? " (here " + strings[0] + ")" : std::string()) +
                      ": mxtrain prepare --field NAME, or in a SageMaker job the text-field hyperparameter");
    }
    return value->get<std::string>();
  }
  return std::nullopt;
}

}  // namespace mxtrain::data
