#include "mxtrain/model/parameters.hpp"

#include <vector>

#include "mxtrain/core/error.hpp"
#include "mxtrain/numerics/split_master.hpp"

namespace mxtrain {

void download_master(Backend& backend, const ParamShard& shard, float* host) {
  if (!shard.master_low.defined()) {
    backend.copy_to_host(shard.master, host);
    return;
  }
  const auto count = static_cast<size_t>(shard.compute_copy.numel());
  std::vector<uint16_t> high(count), low(count);
  backend.copy_to_host(shard.compute_copy, high.data());
  backend.copy_to_host(shard.master_low, low.data());
  for (size_t i = 0; i < count; ++i) host[i] = numerics::join_master(high[i], low[i]);
}

void upload_master(Backend& backend, const ParamShard& shard, const float* host) {
  if (!shard.master_low.defined()) {
    backend.copy_from_host(host, shard.master);
    if (shard.compute_copy.defined()) backend.copy(shard.master, shard.compute_copy);
    return;
  }
  MXTRAIN_ASSERT(shard.compute_copy.defined() && shard.compute_copy.dtype == DType::bf16 &&
                     shard.master_low.numel() == 2 * shard.compute_copy.numel(),
                 "a split master needs a bf16 compute copy and 2 bytes of low halves a weight");
  const auto count = static_cast<size_t>(shard.compute_copy.numel());
  std::vector<uint16_t> high(count), low(count);
  for (size_t i = 0; i < count; ++i) {
    const numerics::SplitMaster halves = numerics::split_master(host[i]);
    high[i] = halves.high;
    low[i] = halves.low;
  }
  backend.copy_from_host(high.data(), shard.compute_copy);
  backend.copy_from_host(low.data(), shard.master_low);
}

Tensor gradient_to_add_to(Backend& backend, const GradTarget& target) {
  if (!target.accumulate) backend.fill(target.tensor, 0.0f);
  return target.tensor;
}

bool GradWrites::claim(size_t index) {
  MXTRAIN_ASSERT(index < written_.size(), "gradient of parameter %zu outside its group of %zu", index,
                 written_.size());
  const bool before = written_[index];
  written_[index] = true;
  return before;
}

void GradWrites::zero_unwritten(Backend& backend, const Tensor& flat, const ParamGroup& group) {
  MXTRAIN_ASSERT(written_.size() == group.params.size(), "gradient bookkeeping of %s was never reset",
                 group.name.c_str());
  // Parameters are laid out back to back in index order (layout.cpp), so runs of unwritten
  // neighbours are contiguous ranges of the flat buffer.
  int64_t run_begin = -1, run_end = -1;
  auto flush = [&] {
    if (run_end > run_begin) backend.fill(flat.slice_flat(run_begin, Shape{run_end - run_begin}), 0.0f);
    run_begin = run_end = -1;
  };
  for (size_t i = 0; i < group.params.size(); ++i) {
    const ParamSpec& spec = group.params[i];
    if (written_[i]) {
      flush();
      continue;
    }
    if (run_end != spec.offset) flush();
    if (run_begin < 0) run_begin = spec.offset;
    run_end = spec.offset + spec.numel();
    written_[i] = true;
  }
  flush();
  // Padding past the group (FSDP's full gradient is a whole number of shards): zeroed with the
  // first completion of the buffer; nothing writes it after.
  if (!padding_zeroed_ && flat.numel() > group.numel) {
    backend.fill(flat.slice_flat(group.numel, Shape{flat.numel() - group.numel}), 0.0f);
  }
  padding_zeroed_ = true;
}

}  // namespace mxtrain
