#include "mxtrain/interop/safetensors.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/files.hpp"

namespace mxtrain::interop {

namespace {

struct DTypeName {
  const char* name;
  int bytes;
  std::optional<DType> dtype;
};

constexpr DTypeName kDTypes[] = {
    {"F64", 8, std::nullopt},   {"F32", 4, DType::f32},      {"F16", 2, DType::f16},
    {"BF16", 2, DType::bf16},   {"I64", 8, std::nullopt},    {"I32", 4, DType::i32},
    {"I16", 2, std::nullopt},   {"I8", 1, std::nullopt},     {"U8", 1, DType::u8},
    {"BOOL", 1, std::nullopt},  {"F8_E4M3", 1, DType::e4m3}, {"F8_E5M2", 1, DType::e5m2},
    {"U16", 2, std::nullopt},   {"U32", 4, std::nullopt},    {"U64", 8, std::nullopt},
};

[[noreturn]] void bad_file(const std::string& path, const std::string& what) {
  throw Error(ErrorKind::data, "safetensors file " + path + ": " + what,
              "the file is damaged or not a safetensors file; copy or download it again");
}

uint64_t checked_product(const std::string& path, const std::string& name, const std::vector<int64_t>& shape,
                         int element_bytes) {
  uint64_t total = static_cast<uint64_t>(element_bytes);
  for (int64_t dim : shape) {
    if (dim < 0) bad_file(path, "tensor '" + name + "' has a negative dimension");
    const uint64_t d = static_cast<uint64_t>(dim);
    if (d != 0 && total > std::numeric_limits<uint64_t>::max() / d)
      bad_file(path, "tensor '" + name + "' has a shape too large to address");
    total *= d;
  }
  return total;
}

void pread_all(int descriptor, void* out, uint64_t bytes, uint64_t at, const std::string& path) {
  auto* cursor = static_cast<char*>(out);
  while (bytes > 0) {
    const ssize_t got = ::pread(descriptor, cursor, bytes, static_cast<off_t>(at));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) throw Error(ErrorKind::data, "cannot read " + path + ": " + std::strerror(errno), "check the file");
    if (got == 0) bad_file(path, "ends early");
    cursor += got;
    at += static_cast<uint64_t>(got);
    bytes -= static_cast<uint64_t>(got);
  }
}

SafetensorsTensor parse_entry(const std::string& path, const std::string& name, const nlohmann::json& entry,
                              uint64_t data_bytes) {
  if (!entry.is_object()) bad_file(path, "entry '" + name + "' is not an object");
  SafetensorsTensor tensor;
  tensor.name = name;
  const auto dtype = entry.find("dtype");
  if (dtype == entry.end() || !dtype->is_string()) bad_file(path, "tensor '" + name + "' has no dtype string");
  tensor.dtype = dtype->get<std::string>();
  const int element = safetensors_element_bytes(tensor.dtype);
  if (element == 0) bad_file(path, "tensor '" + name + "' has the unknown dtype '" + tensor.dtype + "'");
  const auto shape = entry.find("shape");
  if (shape == entry.end() || !shape->is_array()) bad_file(path, "tensor '" + name + "' has no shape array");
  for (const nlohmann::json& dim : *shape) {
    if (!dim.is_number_unsigned() && !(dim.is_number_integer() && dim.get<int64_t>() >= 0))
      bad_file(path, "tensor '" + name + "' has a dimension that is not a non-negative integer");
    const uint64_t value = dim.get<uint64_t>();
    if (value > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      bad_file(path, "tensor '" + name + "' has a dimension too large");
    tensor.shape.push_back(static_cast<int64_t>(value));
  }
  const auto offsets = entry.find("data_offsets");
  if (offsets == entry.end() || !offsets->is_array() || offsets->size() != 2 || !(*offsets)[0].is_number_unsigned() ||
      !(*offsets)[1].is_number_unsigned())
    bad_file(path, "tensor '" + name + "' has no data_offsets [begin, end]");
  tensor.begin = (*offsets)[0].get<uint64_t>();
  tensor.end = (*offsets)[1].get<uint64_t>();
  if (tensor.begin > tensor.end || tensor.end > data_bytes)
    bad_file(path, strf("tensor '%s' has data_offsets [%llu, %llu] outside the %llu data bytes", name.c_str(),
                        static_cast<unsigned long long>(tensor.begin), static_cast<unsigned long long>(tensor.end),
                        static_cast<unsigned long long>(data_bytes)));
  const uint64_t bytes = checked_product(path, name, tensor.shape, element);
  if (bytes != tensor.end - tensor.begin)
    bad_file(path, strf("tensor '%s' has %llu bytes of data but its dtype and shape need %llu", name.c_str(),
                        static_cast<unsigned long long>(tensor.end - tensor.begin),
                        static_cast<unsigned long long>(bytes)));
  return tensor;
}

}  // namespace

int64_t SafetensorsTensor::numel() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

int safetensors_element_bytes(const std::string& dtype) {
  for (const DTypeName& entry : kDTypes)
    if (dtype == entry.name) return entry.bytes;
  return 0;
}

std::string safetensors_dtype(DType dtype) {
  for (const DTypeName& entry : kDTypes)
    if (entry.dtype == dtype) return entry.name;
  throw Error(ErrorKind::unsupported, "safetensors has no dtype for " + std::string(dtype_name(dtype)),
              "export in bf16, f16 or f32");
}

std::optional<DType> mxtrain_dtype(const std::string& safetensors_dtype) {
  for (const DTypeName& entry : kDTypes)
    if (safetensors_dtype == entry.name) return entry.dtype;
  return std::nullopt;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  descriptor_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (descriptor_ < 0)
    throw Error(ErrorKind::data, "cannot open " + path + ": " + std::strerror(errno),
                "check the path of the model directory and its permissions");
  try {
    struct stat status {};
    if (::fstat(descriptor_, &status) != 0 || !S_ISREG(status.st_mode)) bad_file(path, "is not a regular file");
    const uint64_t file_bytes = static_cast<uint64_t>(status.st_size);
    if (file_bytes < 8) bad_file(path, "is shorter than its 8-byte header length");
    unsigned char length_bytes[8];
    pread_all(descriptor_, length_bytes, 8, 0, path);
    uint64_t header_bytes = 0;
    for (int i = 7; i >= 0; --i) header_bytes = (header_bytes << 8) | length_bytes[i];
    if (header_bytes > kMaxSafetensorsHeaderBytes || header_bytes > file_bytes - 8)
      bad_file(path, strf("declares a %llu-byte header in a %llu-byte file", static_cast<unsigned long long>(header_bytes),
                          static_cast<unsigned long long>(file_bytes)));
    std::string text(header_bytes, '\0');
    pread_all(descriptor_, text.data(), header_bytes, 8, path);
    data_start_ = 8 + header_bytes;
    const uint64_t data_bytes = file_bytes - data_start_;
    nlohmann::json header = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
    if (header.is_discarded()) bad_file(path, "its header is not valid JSON");
    if (!header.is_object()) bad_file(path, "its header is not a JSON object");
    for (auto item = header.begin(); item != header.end(); ++item) {
      if (item.key() == "__metadata__") {
        if (!item->is_object()) bad_file(path, "__metadata__ is not an object");
        for (auto field = item->begin(); field != item->end(); ++field) {
          if (!field->is_string()) bad_file(path, "__metadata__ value '" + field.key() + "' is not a string");
          metadata_[field.key()] = field->get<std::string>();
        }
        continue;
      }
      tensors_.push_back(parse_entry(path, item.key(), *item, data_bytes));
    }
    // The ranges must tile the data area: no overlap, no gap, nothing after the last tensor.
    std::vector<const SafetensorsTensor*> by_offset;
    for (const SafetensorsTensor& tensor : tensors_) by_offset.push_back(&tensor);
    std::sort(by_offset.begin(), by_offset.end(), [](const SafetensorsTensor* a, const SafetensorsTensor* b) {
      return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
    });
    uint64_t expected = 0;
    for (const SafetensorsTensor* tensor : by_offset) {
      if (tensor->begin != expected)
        bad_file(path, strf("tensor '%s' starts at byte %llu of the data, expected %llu (overlapping or missing data)",
                            tensor->name.c_str(), static_cast<unsigned long long>(tensor->begin),
                            static_cast<unsigned long long>(expected)));
      expected = tensor->end;
    }
    if (expected != data_bytes)
      bad_file(path, strf("has %llu data bytes but its tensors cover %llu", static_cast<unsigned long long>(data_bytes),
                          static_cast<unsigned long long>(expected)));
  } catch (...) {
    ::close(descriptor_);
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (descriptor_ >= 0) ::close(descriptor_);
}

const SafetensorsTensor* SafetensorsReader::find(const std::string& name) const {
  for (const SafetensorsTensor& tensor : tensors_)
    if (tensor.name == name) return &tensor;
  return nullptr;
}

void SafetensorsReader::read_bytes(const SafetensorsTensor& tensor, uint64_t offset, uint64_t bytes, void* out) const {
  MXTRAIN_ASSERT(offset <= tensor.end - tensor.begin && bytes <= tensor.end - tensor.begin - offset,
                 "read of %llu bytes at %llu past tensor %s", static_cast<unsigned long long>(bytes),
                 static_cast<unsigned long long>(offset), tensor.name.c_str());
  pread_all(descriptor_, out, bytes, data_start_ + tensor.begin + offset, path_);
}

void SafetensorsReader::read_f32(const SafetensorsTensor& tensor, int64_t first, int64_t count, float* out) const {
  MXTRAIN_ASSERT(first >= 0 && count >= 0 && first + count <= tensor.numel(), "elements [%lld, +%lld) of %s",
                 static_cast<long long>(first), static_cast<long long>(count), tensor.name.c_str());
  const std::optional<DType> dtype = mxtrain_dtype(tensor.dtype);
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    throw Error(ErrorKind::data,
                "tensor '" + tensor.name + "' in " + path_ + " is " + tensor.dtype + ", not a floating-point weight",
                "mxtrain loads F32, BF16 and F16 weights");
  const int element = dtype_bits(*dtype) / 8;
  constexpr int64_t kChunk = 1 << 20;
  std::vector<uint16_t> half;
  for (int64_t done = 0; done < count; done += kChunk) {
    const int64_t n = std::min(kChunk, count - done);
    const uint64_t at = static_cast<uint64_t>(first + done) * static_cast<uint64_t>(element);
    if (*dtype == DType::f32) {
      read_bytes(tensor, at, static_cast<uint64_t>(n) * 4, out + done);
      continue;
    }
    half.resize(static_cast<size_t>(n));
    read_bytes(tensor, at, static_cast<uint64_t>(n) * 2, half.data());
    for (int64_t i = 0; i < n; ++i)
      out[done + i] = *dtype == DType::bf16 ? bf16_to_float(half[static_cast<size_t>(i)])
                                            : f16_to_float(half[static_cast<size_t>(i)]);
  }
}

SafetensorsWriter::SafetensorsWriter(std::string path, const std::vector<Declaration>& tensors,
                                     const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), temporary_(path_ + ".tmp") {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Declaration& tensor : tensors) {
    MXTRAIN_ASSERT(!header.contains(tensor.name), "tensor %s declared twice", tensor.name.c_str());
    const std::string dtype = safetensors_dtype(tensor.dtype);
    const uint64_t bytes = checked_product(path_, tensor.name, tensor.shape, safetensors_element_bytes(dtype));
    header[tensor.name] = {{"dtype", dtype}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  data_bytes_ = offset;
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // the data area starts 8-byte aligned
  header_bytes_ = 8 + text.size();
  std::string prefix(8, '\0');
  for (int i = 0; i < 8; ++i) prefix[static_cast<size_t>(i)] = static_cast<char>((text.size() >> (8 * i)) & 0xff);
  descriptor_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (descriptor_ < 0) fail("cannot create");
  const std::string start = prefix + text;
  for (size_t done = 0; done < start.size();) {
    const ssize_t n = ::write(descriptor_, start.data() + done, start.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write the header of");
    done += static_cast<size_t>(n);
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (descriptor_ >= 0) ::close(descriptor_);
  if (!committed_) ::unlink(temporary_.c_str());
}

void SafetensorsWriter::fail(const std::string& what) {
  const int saved = errno;
  if (descriptor_ >= 0) ::close(descriptor_);
  descriptor_ = -1;
  ::unlink(temporary_.c_str());
  throw Error(ErrorKind::system, what + " " + path_ + ": " + std::strerror(saved),
              "check that the output directory is writable and has free space");
}

void SafetensorsWriter::append(const void* data, uint64_t bytes) {
  MXTRAIN_ASSERT(descriptor_ >= 0 && !committed_, "append to a closed safetensors writer");
  MXTRAIN_ASSERT(written_ + bytes <= data_bytes_, "more bytes than the declared tensors hold");
  const auto* cursor = static_cast<const char*>(data);
  for (uint64_t done = 0; done < bytes;) {
    const ssize_t n = ::write(descriptor_, cursor + done, bytes - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail("cannot write");
    done += static_cast<uint64_t>(n);
  }
  written_ += bytes;
}

void SafetensorsWriter::commit() {
  MXTRAIN_ASSERT(written_ == data_bytes_, "commit after %llu of %llu data bytes",
                 static_cast<unsigned long long>(written_), static_cast<unsigned long long>(data_bytes_));
  if (::fsync(descriptor_) != 0) fail("cannot flush");
  const int descriptor = descriptor_;
  descriptor_ = -1;
  if (::close(descriptor) != 0) fail("cannot close");
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) fail("cannot rename onto");
  committed_ = true;
  const std::filesystem::path parent = std::filesystem::path(path_).parent_path();
  fsync_path(parent.empty() ? "." : parent.string(), true);
}

}  // namespace mxtrain::interop
