// End-to-end checks on the GPU: 300 steps on the real-text corpus end within 2% of the CPU FP32
// curve (same seed, same data), and a deliberately oversized batch ends with the out-of-memory
// message, a non-zero exit and no checkpoint left behind.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "mxtrain/config/loader.hpp"
#include "mxtrain/train/trainer.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

std::string corpus_dir() { return test::source_dir() + "/data/fortunes"; }

RunConfig corpus_run(const std::string& device, const std::string& precision, const std::string& run_dir) {
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = {{"train.device", device},        {"train.precision", precision},
                       {"train.steps", "300"},          {"train.micro_batch_size", "8"},
                       {"train.seq_len", "128"},        {"eval.every", "0"},
                       {"eval.batches", "4"},           {"checkpoint.every", "0"},
                       {"checkpoint.dir", run_dir},     {"log.every", "50"},
                       {"data.train", corpus_dir() + "/train_*.bin"},
                       {"data.val", corpus_dir() + "/val_*.bin"}};
  return load_config(sources);
}

std::vector<double> curve(const std::string& run_dir) {
  std::vector<double> losses;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains("loss")) losses.push_back(record["loss"].get<double>());
  }
  return losses;
}

double tail_mean(const std::vector<double>& losses, size_t count) {
  double sum = 0;
  for (size_t i = losses.size() - count; i < losses.size(); ++i) sum += losses[i];
  return sum / static_cast<double>(count);
}

TEST(CudaTraining, ThreeHundredStepsTrackTheCpuCurve) {
  if (!backend_available("cuda")) GTEST_SKIP() << "no CUDA device";
  ASSERT_TRUE(std::filesystem::exists(corpus_dir() + "/train_000000.bin"))
      << "the corpus is missing: run scripts/setup.sh (or mxtrain prepare) first";
  test::TempDir dir;
  TrainerSummary cpu = Trainer(corpus_run("cpu", "fp32", dir.file("cpu")), {}).run();
  TrainerSummary gpu = Trainer(corpus_run("cuda", "bf16", dir.file("cuda")), {}).run();
  std::vector<double> cpu_curve = curve(dir.file("cpu")), gpu_curve = curve(dir.file("cuda"));
  ASSERT_EQ(cpu_curve.size(), 300u);
  ASSERT_EQ(gpu_curve.size(), 300u);
  // The end of the curve: mean of the last 20 steps (single steps are noisy batches).
  const double cpu_end = tail_mean(cpu_curve, 20), gpu_end = tail_mean(gpu_curve, 20);
  std::printf("[ info  ] 300-step curve end: cpu fp32 %.4f, cuda bf16 %.4f (%.2f%%); held-out %.4f vs %.4f\n", cpu_end,
              gpu_end, 100 * std::fabs(gpu_end - cpu_end) / cpu_end, cpu.final_val_loss, gpu.final_val_loss);
  EXPECT_LT(std::fabs(gpu_end - cpu_end), 0.02 * cpu_end);
  EXPECT_LT(std::fabs(gpu.final_val_loss - cpu.final_val_loss), 0.02 * cpu.final_val_loss);
  EXPECT_LT(cpu_end, 0.6 * cpu_curve.front()) << "the loss did not fall";
}

TEST(CudaTraining, OversizedBatchEndsWithTheOutOfMemoryMessage) {
  if (!backend_available("cuda")) GTEST_SKIP() << "no CUDA device";
  test::TempDir dir;
  std::string output;
  int status = test::run_command(test::binary_path() + " train -d cuda -p bf16 -m llama-1b -b 512 -s 2048 --steps 2 -o " +
                                     dir.file("run") + " --set data.train=" + corpus_dir() + "/train_*.bin --set data.val=",
                                 &output);
  std::printf("%s\n", output.substr(output.size() > 1500 ? output.size() - 1500 : 0).c_str());
  EXPECT_NE(status, 0);
  EXPECT_NE(output.find("out of memory"), std::string::npos);
  EXPECT_NE(output.find("could not allocate"), std::string::npos);
  EXPECT_NE(output.find("reserved"), std::string::npos);
  EXPECT_NE(output.find("capacity"), std::string::npos);
  EXPECT_NE(output.find("fix:"), std::string::npos);
  EXPECT_EQ(output.find("Stack trace"), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.file("run") + "/checkpoints"));
}

}  // namespace
}  // namespace mxtrain
