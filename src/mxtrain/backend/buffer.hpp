// Buffer: the owner of one allocation from a Backend's caching allocator. Move-only; the
// memory returns to the allocator's cache when the Buffer dies, so lifetimes in model code
// are C++ scopes and the dryrun sees exactly the same frees as the real run.
#pragma once
#include "mxtrain/backend/allocator.hpp"
#include "mxtrain/core/tensor.hpp"

namespace mxtrain {

class Buffer {
 public:
  Buffer() = default;
  Buffer(CachingAllocator* allocator, CachingAllocator::Block* block, Tensor tensor)
      : allocator_(allocator), block_(block), tensor_(tensor) {}
  ~Buffer() { reset(); }
  Buffer(Buffer&& other) noexcept { *this = std::move(other); }
  Buffer& operator=(Buffer&& other) noexcept {
    if (this != &other) {
      reset();
      allocator_ = other.allocator_;
      block_ = other.block_;
      tensor_ = other.tensor_;
      other.allocator_ = nullptr;
      other.block_ = nullptr;
      other.tensor_ = Tensor();
    }
    return *this;
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  void reset() {
    if (allocator_ && block_) allocator_->release(block_);
    allocator_ = nullptr;
    block_ = nullptr;
    tensor_ = Tensor();
  }
  bool defined() const { return tensor_.defined(); }
  const Tensor& tensor() const { return tensor_; }
  operator const Tensor&() const { return tensor_; }  // NOLINT: a Buffer is used where its Tensor is

 private:
  CachingAllocator* allocator_ = nullptr;
  CachingAllocator::Block* block_ = nullptr;
  Tensor tensor_;
};

}  // namespace mxtrain
