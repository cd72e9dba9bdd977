// safetensors files (interop/safetensors): the JSON header, dtypes, shapes and data offsets,
// then every tensor's first elements read.
#include <algorithm>
#include <vector>

#include "fuzz_support.hpp"
#include "mxtrain/interop/safetensors.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace mxtrain;
  const std::string path = fuzz::write_input("model.safetensors", data, size);
  return fuzz::run_one([&] {
    interop::SafetensorsReader reader(path);
    std::vector<float> values(64);
    for (const interop::SafetensorsTensor& tensor : reader.tensors()) {
      if (tensor.dtype != "F32" && tensor.dtype != "BF16" && tensor.dtype != "F16") continue;
      const int64_t count = std::min<int64_t>(tensor.numel(), 64);
      if (count > 0) reader.read_f32(tensor, 0, count, values.data());
    }
  });
}
