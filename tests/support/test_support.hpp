// Helpers shared by the tests: deterministic random tensors, comparisons with the tolerance
// stated at the call site, and paths of the source tree and the built binary.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/model/config.hpp"

namespace mxtrain::test {

std::string source_dir();  // the repository root
std::string binary_path(); // the built mxtrain executable

// Uniform values in [low, high) from a fixed seed (xorshift; platform independent).
std::vector<float> random_vector(size_t count, uint64_t seed, float low = -1.0f, float high = 1.0f);

// Allocates a tensor on the backend and fills it from host floats (converted to dtype).
Buffer upload(Backend& backend, const std::vector<float>& values, Shape shape, DType dtype = DType::f32,
              const std::string& name = "test");
Buffer upload_i32(Backend& backend, const std::vector<int32_t>& values, Shape shape, const std::string& name = "test");
// Reads any float tensor back as f32.
std::vector<float> download(Backend& backend, const Tensor& tensor);

// max |a-b| / max(|b|, floor) over elements, and the relative L2 error ||a-b|| / ||b||.
double max_relative_error(const std::vector<float>& a, const std::vector<float>& b, double floor = 1e-6);
double relative_l2_error(const std::vector<float>& a, const std::vector<float>& b);

// A fresh temporary directory, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

// Writes a small pseudo-English text (about `bytes` bytes, fixed seed) and prepares it into
// train/val shards under dir with the byte tokenizer; returns dir.
std::string make_test_corpus(const std::string& dir, size_t bytes = 160000);

// A model of `family` small enough to step in milliseconds on the CPU: hidden 64, 4 heads (2
// key/value heads for Llama), feed-forward 96, sequences up to `max_seq_len`.
ModelConfig small_model(ModelFamily family, int64_t layers, int64_t max_seq_len = 32);

// The config of a training run that takes a second on the CPU: a 2-layer, 64-wide Llama on
// make_test_corpus's shards in `corpus`, 32 tokens a sequence, micro-batch 4 and global batch 8,
// held-out loss (2 batches) and a checkpoint every 3 steps into `run_dir`; `extra` overrides
// come after these (ConfigSources order: a later key wins).
RunConfig tiny_training_run(const std::string& corpus, const std::string& run_dir, int64_t steps,
                            const std::vector<std::pair<std::string, std::string>>& extra = {});

// A whole file's bytes ("" when it cannot be read).
std::string read_file(const std::string& path);

// Runs a shell command, returns its exit status; stdout+stderr go to *output when given.
int run_command(const std::string& command, std::string* output = nullptr);

}  // namespace mxtrain::test
