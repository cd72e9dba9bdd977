// A SageMaker job's hyperparameters.json (sagemaker/hyperparameters: parse, then map the names
// onto config keys and check each value against its key's rules). Only mxtrain::Error may leave.
#include <string_view>

#include "fuzz_support.hpp"
#include "mxtrain/sagemaker/hyperparameters.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  return mxtrain::fuzz::run_one([&] { mxtrain::sagemaker::parse_hyperparameters(input); });
}
