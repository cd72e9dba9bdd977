// The safetensors reader and writer: a round trip keeps every byte, and every kind of damaged
// header is an Error(data) naming the file, never a crash or a buffer sized from a bad field.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "mxtrain/core/error.hpp"
#include "mxtrain/interop/safetensors.hpp"
#include "support/test_support.hpp"

namespace mxtrain::interop {
namespace {

std::string raw_file(const std::string& header, size_t data_bytes) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[static_cast<size_t>(i)] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  return bytes + header + std::string(data_bytes, '\x01');
}

void write_raw(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

TEST(Safetensors, RoundTripKeepsNamesShapesDtypesAndBytes) {
  test::TempDir dir;
  const std::string path = dir.file("model.safetensors");
  std::vector<float> a(6);
  for (size_t i = 0; i < a.size(); ++i) a[i] = 0.5f * static_cast<float>(i) - 1.0f;
  std::vector<uint16_t> b{float_to_bf16(1.5f), float_to_bf16(-2.25f), float_to_bf16(3.0e-3f)};
  std::vector<uint16_t> c{float_to_f16(0.125f), float_to_f16(-7.0f)};
  {
    SafetensorsWriter writer(path, {{"a", DType::f32, {2, 3}}, {"b", DType::bf16, {3}}, {"c", DType::f16, {2, 1}}},
                             {{"format", "pt"}});
    writer.append(a.data(), 8);  // in pieces of any size
    writer.append(reinterpret_cast<const char*>(a.data()) + 8, 16);
    writer.append(b.data(), 6);
    writer.append(c.data(), 4);
    writer.commit();
    EXPECT_EQ(writer.file_bytes() % 8, 2u);  // header padded to 8; 34 data bytes
  }
  SafetensorsReader reader(path);
  ASSERT_EQ(reader.tensors().size(), 3u);
  EXPECT_EQ(reader.metadata().at("format"), "pt");
  const SafetensorsTensor* ta = reader.find("a");
  ASSERT_NE(ta, nullptr);
  EXPECT_EQ(ta->dtype, "F32");
  EXPECT_EQ(ta->shape, (std::vector<int64_t>{2, 3}));
  std::vector<float> back(6);
  reader.read_f32(*ta, 0, 6, back.data());
  EXPECT_EQ(back, a);
  std::vector<float> widened(3);
  reader.read_f32(*reader.find("b"), 0, 3, widened.data());
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(widened[i], bf16_to_float(b[i]));
  float tail = 0;
  reader.read_f32(*reader.find("c"), 1, 1, &tail);
  EXPECT_EQ(tail, -7.0f);
  EXPECT_EQ(reader.find("missing"), nullptr);
}

TEST(Safetensors, AnUncommittedWriterLeavesNoFile) {
  test::TempDir dir;
  const std::string path = dir.file("model.safetensors");
  {
    SafetensorsWriter writer(path, {{"a", DType::f32, {4}}});
    float x = 1;
    writer.append(&x, 4);
  }
  EXPECT_FALSE(std::ifstream(path).good());
  EXPECT_FALSE(std::ifstream(path + ".tmp").good());
}

TEST(Safetensors, DamagedHeadersAreDataErrorsThatNameTheFile) {
  test::TempDir dir;
  const std::string path = dir.file("bad.safetensors");
  const std::string ok = R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})";
  struct Case {
    const char* what;
    std::string bytes;
  } cases[] = {
      {"short file", std::string("\x05\x00\x00", 3)},
      {"header longer than the file", raw_file(ok, 8).substr(0, 20)},
      {"huge header length", std::string("\xff\xff\xff\xff\xff\xff\xff\x7f", 8) + "{}"},
      {"not JSON", raw_file("{\"w\":", 0)},
      {"not an object", raw_file("[1,2]", 0)},
      {"unknown dtype", raw_file(R"({"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,8]}})", 8)},
      {"no shape", raw_file(R"({"w":{"dtype":"F32","data_offsets":[0,8]}})", 8)},
      {"negative dim", raw_file(R"({"w":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})", 8)},
      {"size mismatch", raw_file(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8)},
      {"offsets past the end", raw_file(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 4)},
      {"reversed offsets", raw_file(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,0]}})", 8)},
      {"overflowing shape",
       raw_file(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,8]}})", 8)},
      {"overlap", raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                           R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                           8)},
      {"gap at the end", raw_file(ok, 12)},
      {"metadata not strings", raw_file(R"({"__metadata__":{"format":3}})", 0)},
  };
  for (const Case& c : cases) {
    write_raw(path, c.bytes);
    try {
      SafetensorsReader reader(path);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const Error& error) {
      EXPECT_EQ(error.kind(), ErrorKind::data) << c.what;
      EXPECT_NE(std::string(error.what()).find(path), std::string::npos) << c.what << ": " << error.what();
    }
  }
  write_raw(path, raw_file(ok, 8));
  EXPECT_NO_THROW(SafetensorsReader{path});
}

}  // namespace
}  // namespace mxtrain::interop
