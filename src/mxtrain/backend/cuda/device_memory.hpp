// Raw device memory for the shared CachingAllocator: whole segments from cudaMalloc. A failed
// cudaMalloc (cudaErrorMemoryAllocation) is cleared and reported as nullptr, so the allocator
// can release cached segments, retry, and then throw its own out-of-memory Error that lists
// live, reserved and capacity bytes.
#pragma once
#include <string>

#include "mxtrain/backend/allocator.hpp"

namespace mxtrain {

class CudaMemorySource final : public MemorySource {
 public:
  explicit CudaMemorySource(int device_index);
  void* allocate_segment(size_t bytes) override;
  void free_segment(void* pointer, size_t bytes) override;
  size_t capacity_bytes() const override { return capacity_bytes_; }
  const char* device_label() const override { return label_.c_str(); }

 private:
  int device_index_;
  size_t capacity_bytes_ = 0;
  std::string label_;
};

}  // namespace mxtrain
