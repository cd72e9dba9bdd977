#include "mxtrain/data/loader.hpp"

#include <algorithm>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"

namespace mxtrain::data {
namespace {

Batch make_batch(const TokenDataset& dataset, const std::vector<int64_t>& samples) {
  Batch batch;
  batch.batch = static_cast<int64_t>(samples.size());
  batch.seq = dataset.seq_len();
  size_t row_tokens = static_cast<size_t>(batch.seq);
  batch.tokens.resize(samples.size() * row_tokens);
  batch.targets.resize(samples.size() * row_tokens);
  for (size_t row = 0; row < samples.size(); ++row) {
    dataset.read_sample(samples[row], batch.tokens.data() + row * row_tokens, batch.targets.data() + row * row_tokens);
  }
  return batch;
}

void require_rows(int64_t rows_per_rank, int rank, int world_size) {
  MXTRAIN_REQUIRE(rows_per_rank > 0, config,
                  strf("micro-batch of %lld rows per rank", static_cast<long long>(rows_per_rank)),
                  "set the micro-batch size to at least 1");
  MXTRAIN_ASSERT(world_size > 0 && rank >= 0 && rank < world_size, "rank %d of %d", rank, world_size);
}

// The dataset's sample count, once the loader's arguments are known to be sound.
int64_t checked_sample_count(const TokenDataset* dataset, int64_t rows_per_rank, int rank, int world_size) {
  MXTRAIN_ASSERT(dataset != nullptr, "a loader needs a dataset");
  require_rows(rows_per_rank, rank, world_size);
  return dataset->sample_count();
}

}  // namespace

std::shared_ptr<const TokenDataset> open_dataset(const std::string& label, const std::string& pattern,
                                                 const std::string& fallback_base_dir, const std::string& config_key,
                                                 int64_t seq_len, int64_t vocab_size) {
  std::vector<std::string> paths = resolve_shard_glob(pattern, fallback_base_dir, config_key);
  auto dataset = std::make_shared<const TokenDataset>(std::move(paths), seq_len, vocab_size);
  log::info(strf("%s data: %s (%s)", label.c_str(), dataset->describe().c_str(), pattern.c_str()));
  return dataset;
}

TrainLoader::TrainLoader(std::shared_ptr<const TokenDataset> dataset, int64_t rows_per_rank, uint64_t seed, int rank,
                         int world_size)
    : dataset_(std::move(dataset)),
      rows_per_rank_(rows_per_rank),
      sampler_(checked_sample_count(dataset_.get(), rows_per_rank, rank, world_size), seed, rank, world_size) {}

Batch TrainLoader::next() {
  return make_batch(*dataset_, sampler_.next_batch(rows_per_rank_ * sampler_.world_size()));
}

ValidationReader::ValidationReader(std::shared_ptr<const TokenDataset> dataset, int64_t rows_per_rank, int rank,
                                   int world_size)
    : dataset_(std::move(dataset)), rows_per_rank_(rows_per_rank), rank_(rank), world_size_(world_size) {
  checked_sample_count(dataset_.get(), rows_per_rank, rank, world_size);
}

int64_t ValidationReader::start(int64_t requested_batches) {
  MXTRAIN_ASSERT(requested_batches >= 0, "requested %lld batches", static_cast<long long>(requested_batches));
  const int64_t global_rows = rows_per_rank_ * world_size_;
  const int64_t whole_batches = std::max<int64_t>(1, dataset_->sample_count() / global_rows);
  batches_left_ = std::min(requested_batches, whole_batches);
  next_window_ = 0;
  return batches_left_;
}

std::optional<Batch> ValidationReader::next() {
  if (batches_left_ == 0) return std::nullopt;
  const int64_t global_rows = rows_per_rank_ * world_size_;
  std::vector<int64_t> samples;
  samples.reserve(static_cast<size_t>(rows_per_rank_));
  for (int64_t row = rank_; row < global_rows; row += world_size_) {
    samples.push_back((next_window_ + row) % dataset_->sample_count());
  }
  next_window_ += global_rows;
  batches_left_ -= 1;
  return make_batch(*dataset_, samples);
}

}  // namespace mxtrain::data
