// A test tool over mxtrain's safetensors code, for tests/interop/safetensors_reference.py:
//   safetensors_tool copy IN OUT   read every tensor of IN with the reader, write them to OUT with
//                                  the writer (same order as IN's data, same metadata)
//   safetensors_tool dump IN       one JSON object: name -> {dtype, shape, f32 values when the
//                                  dtype is F32/BF16/F16 (widened by read_f32)}
// Exit 1 with the error's message on stderr when mxtrain refuses the file.
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mxtrain/core/error.hpp"
#include "mxtrain/interop/safetensors.hpp"

using namespace mxtrain;
using namespace mxtrain::interop;

int main(int argc, char** argv) {
  try {
    const std::string verb = argc > 1 ? argv[1] : "";
    if (verb == "copy" && argc == 4) {
      SafetensorsReader reader(argv[2]);
      std::vector<const SafetensorsTensor*> order;
      for (const SafetensorsTensor& tensor : reader.tensors()) order.push_back(&tensor);
      std::sort(order.begin(), order.end(), [](auto* a, auto* b) { return a->begin < b->begin; });
      std::vector<SafetensorsWriter::Declaration> declarations;
      for (const SafetensorsTensor* tensor : order) {
        const std::optional<DType> dtype = mxtrain_dtype(tensor->dtype);
        if (!dtype) throw Error(ErrorKind::unsupported, "no mxtrain dtype for " + tensor->dtype);
        declarations.push_back({tensor->name, *dtype, tensor->shape});
      }
      SafetensorsWriter writer(argv[3], declarations, reader.metadata());
      for (const SafetensorsTensor* tensor : order) {
        std::vector<char> bytes(tensor->end - tensor->begin);
        reader.read_bytes(*tensor, 0, bytes.size(), bytes.data());
        writer.append(bytes.data(), bytes.size());
      }
      writer.commit();
      return 0;
    }
    if (verb == "dump" && argc == 3) {
      SafetensorsReader reader(argv[2]);
      nlohmann::json out = nlohmann::json::object();
      for (const SafetensorsTensor& tensor : reader.tensors()) {
        nlohmann::json entry{{"dtype", tensor.dtype}, {"shape", tensor.shape}};
        const std::optional<DType> dtype = mxtrain_dtype(tensor.dtype);
        if (dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16) {
          std::vector<float> values(static_cast<size_t>(tensor.numel()));
          reader.read_f32(tensor, 0, tensor.numel(), values.data());
          entry["values"] = values;
        }
        out[tensor.name] = entry;
      }
      out["__metadata__"] = reader.metadata();
      std::puts(out.dump().c_str());
      return 0;
    }
    std::fprintf(stderr, "usage: safetensors_tool copy IN OUT | dump IN\n");
    return 2;
  } catch (const Error& error) {
    std::fprintf(stderr, "%s\n", error.full_message().c_str());
    return 1;
  }
}
