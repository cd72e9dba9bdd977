#include "mxtrain/backend/dryrun/dryrun_backend.hpp"

#include "mxtrain/core/error.hpp"

namespace mxtrain {
namespace {

// Fake addresses: segments are laid out one after another in a 2^60-byte space, never touched.
class FakeMemory final : public MemorySource {
 public:
  FakeMemory(size_t capacity, std::string label) : capacity_(capacity), label_("simulated " + label) {}
  void* allocate_segment(size_t bytes) override {
    if (capacity_ && in_use_ + bytes > capacity_) return nullptr;
    in_use_ += bytes;
    uintptr_t address = next_;
    next_ += bytes;
    return reinterpret_cast<void*>(address);
  }
  void free_segment(void*, size_t bytes) override { in_use_ -= bytes; }
  size_t capacity_bytes() const override { return capacity_; }
  const char* device_label() const override { return label_.c_str(); }

 private:
  size_t capacity_;
  std::string label_;
  size_t in_use_ = 0;
  uintptr_t next_ = uintptr_t{1} << 44;
};

}  // namespace

DryrunBackend::DryrunBackend(size_t memory_bytes, std::string label)
    : Backend(std::make_unique<FakeMemory>(memory_bytes, label.empty() ? "device" : label)),
      memory_bytes_(memory_bytes), label_(std::move(label)) {}

DeviceProperties DryrunBackend::properties() const {
  DeviceProperties props;
  props.name = "dryrun " + (label_.empty() ? std::string("device") : label_);
  props.memory_bytes = memory_bytes_;
  return props;
}

bool DryrunBackend::supports(OpKind, DType dtype) const {
  // Records any op the real backends implement.
  return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16;
}

}  // namespace mxtrain
