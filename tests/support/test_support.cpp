#include "support/test_support.hpp"

#include <sys/wait.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/data/prepare.hpp"

namespace mxtrain::test {

std::string source_dir() { return MXTRAIN_SOURCE_DIR; }
std::string binary_path() { return MXTRAIN_BINARY; }

std::vector<float> random_vector(size_t count, uint64_t seed, float low, float high) {
  std::vector<float> values(count);
  uint64_t state = seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull;
  for (size_t i = 0; i < count; ++i) {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    double unit = static_cast<double>(state >> 11) * 0x1.0p-53;
    values[i] = static_cast<float>(low + (high - low) * unit);
  }
  return values;
}

Buffer upload(Backend& backend, const std::vector<float>& values, Shape shape, DType dtype, const std::string& name) {
  MXTRAIN_ASSERT(static_cast<int64_t>(values.size()) == shape.numel(), "upload size");
  Buffer staging = backend.allocate(name + ".f32", shape, DType::f32, Lifetime::scratch);
  backend.copy_from_host(values.data(), staging);
  if (dtype == DType::f32) return staging;
  Buffer converted = backend.allocate(name, shape, dtype, Lifetime::scratch);
  backend.copy(staging, converted);
  return converted;
}

Buffer upload_i32(Backend& backend, const std::vector<int32_t>& values, Shape shape, const std::string& name) {
  MXTRAIN_ASSERT(static_cast<int64_t>(values.size()) == shape.numel(), "upload size");
  Buffer buffer = backend.allocate(name, shape, DType::i32, Lifetime::scratch);
  backend.copy_from_host(values.data(), buffer);
  return buffer;
}

std::vector<float> download(Backend& backend, const Tensor& tensor) {
  std::vector<float> values(static_cast<size_t>(tensor.numel()));
  if (tensor.dtype == DType::f32) {
    backend.copy_to_host(tensor, values.data());
    return values;
  }
  Buffer staging = backend.allocate("download", tensor.shape, DType::f32, Lifetime::scratch);
  backend.copy(tensor, staging);
  backend.copy_to_host(staging, values.data());
  return values;
}

double max_relative_error(const std::vector<float>& a, const std::vector<float>& b, double floor) {
  MXTRAIN_ASSERT(a.size() == b.size(), "size mismatch %zu vs %zu", a.size(), b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double denom = std::max(std::fabs(static_cast<double>(b[i])), floor);
    double error = std::fabs(static_cast<double>(a[i]) - b[i]) / denom;
    if (std::isnan(error)) return INFINITY;
    worst = std::max(worst, error);
  }
  return worst;
}

double relative_l2_error(const std::vector<float>& a, const std::vector<float>& b) {
  MXTRAIN_ASSERT(a.size() == b.size(), "size mismatch %zu vs %zu", a.size(), b.size());
  double diff = 0, ref = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    ref += static_cast<double>(b[i]) * b[i];
  }
  if (std::isnan(diff)) return INFINITY;
  return ref > 0 ? std::sqrt(diff / ref) : std::sqrt(diff);
}

TempDir::TempDir() {
  std::string pattern = (std::filesystem::temp_directory_path() / "mxtrain-test-XXXXXX").string();
  char* made = mkdtemp(pattern.data());
  MXTRAIN_ASSERT(made != nullptr, "mkdtemp failed");
  path_ = made;
}

TempDir::~TempDir() {
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string make_test_corpus(const std::string& dir, size_t bytes) {
  static const char* const words[] = {"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and",
                                      "then", "it", "runs", "far", "away", "from", "home", "while", "we", "sleep",
                                      "under", "stars", "of", "winter", "light", "is", "slow", "but", "sure"};
  std::filesystem::create_directories(dir);
  std::string text_path = dir + "/corpus.txt";
  std::ofstream out(text_path);
  uint64_t state = 0x1234567887654321ull;
  size_t written = 0, in_sentence = 0;
  while (written < bytes) {
    state ^= state << 13, state ^= state >> 7, state ^= state << 17;
    std::string word = words[state % (sizeof words / sizeof words[0])];
    if (in_sentence == 0) word[0] = static_cast<char>(word[0] - 'a' + 'A');
    ++in_sentence;
    bool end = in_sentence > 4 && (state >> 20) % 5 == 0;
    std::string piece = word + (end ? ".\n" : " ");
    if (end) in_sentence = 0;
    out << piece;
    written += piece.size();
  }
  out.close();
  data::PrepareOptions options;
  options.output_dir = dir;
  options.input_files = {text_path};
  options.val_fraction = 0.1;
  data::prepare_corpus(options);
  return dir;
}

int run_command(const std::string& command, std::string* output) {
  std::string full = command + " 2>&1";
  FILE* pipe = popen(full.c_str(), "r");
  if (!pipe) return -1;
  char buffer[4096];
  std::string text;
  while (size_t got = fread(buffer, 1, sizeof buffer, pipe)) text.append(buffer, got);
  int status = pclose(pipe);
  if (output) *output = text;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

ModelConfig small_model(ModelFamily family, int64_t layers, int64_t max_seq_len) {
  ModelConfig config = model_preset(family == ModelFamily::llama ? "tiny" : "tiny-gpt2");
  config.hidden = 64;
  config.heads = 4;
  config.kv_heads = family == ModelFamily::llama ? 2 : 4;
  config.layers = layers;
  config.ffn_hidden = 96;
  config.max_seq_len = max_seq_len;
  return config;
}

RunConfig tiny_training_run(const std::string& corpus, const std::string& run_dir, int64_t steps,
                            const std::vector<std::pair<std::string, std::string>>& extra) {
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = {{"model.hidden", "64"},          {"model.heads", "2"},           {"model.kv_heads", "1"},
                       {"model.layers", "2"},           {"model.ffn_hidden", "128"},    {"train.seq_len", "32"},
                       {"train.micro_batch_size", "4"}, {"train.global_batch_size", "8"},
                       {"train.steps", std::to_string(steps)},
                       {"train.device", "cpu"},         {"schedule.warmup_steps", "2"}, {"eval.every", "3"},
                       {"eval.batches", "2"},           {"checkpoint.every", "3"},      {"checkpoint.dir", run_dir},
                       {"data.train", corpus + "/train_*.bin"}, {"data.val", corpus + "/val_*.bin"}};
  sources.overrides.insert(sources.overrides.end(), extra.begin(), extra.end());
  return load_config(sources);
}

}  // namespace mxtrain::test
