#include "mpi/mpi_support.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/train/checkpoint.hpp"
#include "support/test_support.hpp"

namespace mxtrain::test {

Communicator& mpi_world() {
  static std::unique_ptr<MpiCommunicator> world = MpiCommunicator::world();
  return *world;
}

SharedTempDir::SharedTempDir() {
  std::string path;
  if (mpi_world().rank() == 0) {
    std::string pattern = (std::filesystem::temp_directory_path() / "mxtrain-mpi-XXXXXX").string();
    path = ::mkdtemp(pattern.data());
  }
  path_ = mpi_broadcast_bytes(path);
  mpi_world().barrier();
}

SharedTempDir::~SharedTempDir() {
  mpi_world().barrier();
  std::error_code ignored;
  if (mpi_world().rank() == 0) std::filesystem::remove_all(path_, ignored);
}

RunConfig tiny_run(const std::string& corpus, const std::string& run_dir, int64_t micro_batch,
                   const std::string& strategy, int64_t steps) {
  return test::tiny_training_run(corpus, run_dir, steps,
                                 {{"train.micro_batch_size", std::to_string(micro_batch)},
                                  {"train.threads", "1"},
                                  {"dist.strategy", strategy}});
}

std::map<int64_t, double> losses(const std::string& run_dir, const std::string& key) {
  std::map<int64_t, double> result;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    nlohmann::json record = nlohmann::json::parse(line);
    if (record.contains(key)) result[record["step"].get<int64_t>()] = record[key].get<double>();
  }
  return result;
}

std::vector<std::vector<float>> checkpoint_weights(const std::string& checkpoint, const RunConfig& config) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  LocalParameterStore store(*backend, config.model, DType::f32, DType::f32);
  CheckpointStore(std::filesystem::path(checkpoint).parent_path().parent_path().string(), 0, 1)
      .load(checkpoint, store.shards(), *backend);
  std::vector<std::vector<float>> weights;
  for (const ParamShard& shard : store.shards()) weights.push_back(download(*backend, shard.master));
  return weights;
}

void expect_losses_match(const std::string& run_dir, const std::string& reference_dir, int64_t first, int64_t last,
                         double relative, const std::string& key) {
  std::map<int64_t, double> got = losses(run_dir, key), expected = losses(reference_dir, key);
  for (int64_t step = first; step <= last; ++step) {
    if (key == "loss") {
      ASSERT_TRUE(got.count(step)) << run_dir << " has no " << key << " at step " << step;
      ASSERT_TRUE(expected.count(step)) << reference_dir << " has no " << key << " at step " << step;
    }
    if (!got.count(step) && !expected.count(step)) continue;
    ASSERT_TRUE(got.count(step) && expected.count(step)) << key << " at step " << step << " in only one run";
    EXPECT_LE(std::fabs(got[step] - expected[step]), relative * std::fabs(expected[step]))
        << key << " at step " << step << ": " << got[step] << " vs one rank's " << expected[step] << " (" << run_dir
        << ")";
  }
}

void expect_weights_match(const std::string& checkpoint, const std::string& reference, const RunConfig& config,
                          double tolerance) {
  std::vector<std::vector<float>> got = checkpoint_weights(checkpoint, config);
  std::vector<std::vector<float>> expected = checkpoint_weights(reference, config);
  ASSERT_EQ(got.size(), expected.size());
  for (size_t g = 0; g < got.size(); ++g) {
    ASSERT_EQ(got[g].size(), expected[g].size());
    double largest = 0, difference = 0;
    for (size_t i = 0; i < got[g].size(); ++i) {
      largest = std::max(largest, std::fabs(static_cast<double>(expected[g][i])));
      difference = std::max(difference, std::fabs(static_cast<double>(got[g][i]) - expected[g][i]));
    }
    EXPECT_LE(difference, tolerance * largest) << "group " << g << " of " << checkpoint;
  }
}

}  // namespace mxtrain::test
