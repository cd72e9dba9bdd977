// The cuda backend as an object: registry entry, device properties, supports(), allocations
// through the caching allocator (workspaces included), an out-of-memory Error with the numbers
// a user needs, and stream-ordered timestamps.
#include "cuda/cuda_test_support.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain::test {
namespace {

class CudaBackendObject : public CudaTest {};

TEST_F(CudaBackendObject, PropertiesAndSupport) {
  EXPECT_EQ(cuda().name(), "cuda");
  EXPECT_EQ(cuda().device(), Device::cuda);
  const DeviceProperties props = cuda().properties();
  std::printf("[ info  ] %s, %.1f GiB, sm_%d, %d SMs\n", props.name.c_str(),
              static_cast<double>(props.memory_bytes) / (1ull << 30), props.compute_capability, props.multiprocessors);
  EXPECT_FALSE(props.name.empty());
  EXPECT_GT(props.memory_bytes, size_t{1} << 30);
  EXPECT_GE(props.compute_capability, 80);
  EXPECT_GT(props.multiprocessors, 0);
  EXPECT_EQ(cuda().memory_stats().capacity_bytes, props.memory_bytes);
  for (int kind = 0; kind < kOpKindCount; ++kind) {
    EXPECT_TRUE(cuda().supports(static_cast<OpKind>(kind), DType::bf16));
    EXPECT_TRUE(cuda().supports(static_cast<OpKind>(kind), DType::f32));
  }
  EXPECT_FALSE(cuda().supports(OpKind::attention_forward, DType::e4m3));
  EXPECT_NE(cuda_backend().stream(), nullptr);
}

TEST_F(CudaBackendObject, WorkspacesComeFromTheAllocator) {
  const MemoryStats stats = cuda().memory_stats();
  // cublaslt.workspace (32 MiB) and reduction.partials (4 KiB) from construction.
  const size_t workspace = stats.live_by_lifetime[static_cast<int>(Lifetime::workspace)];
  EXPECT_EQ(workspace, (size_t{32} << 20) + 4096);
  bool found = false;
  for (const auto& entry : cuda().allocator().live_entries()) found |= entry.name == "cublaslt.workspace";
  EXPECT_TRUE(found);
}

TEST_F(CudaBackendObject, OutOfMemoryIsAnErrorWithTheNumbers) {
  Buffer held = cuda().allocate("held", Shape{int64_t{1} << 28}, DType::f32, Lifetime::activation);  // 1 GiB
  const size_t far_too_much = cuda().properties().memory_bytes * 4;
  try {
    Buffer huge = cuda().allocate("huge.activation", Shape{static_cast<int64_t>(far_too_much / 2)}, DType::bf16,
                                  Lifetime::activation);
    FAIL() << "allocating " << far_too_much << " bytes should fail";
  } catch (const Error& error) {
    const std::string what = error.what();
    std::printf("[ info  ] %s\n", error.full_message().c_str());
    EXPECT_EQ(error.kind(), ErrorKind::out_of_memory);
    EXPECT_NE(what.find("could not allocate"), std::string::npos) << what;  // requested
    EXPECT_NE(what.find("huge.activation"), std::string::npos) << what;
    EXPECT_NE(what.find("in use"), std::string::npos) << what;
    EXPECT_NE(what.find("reserved"), std::string::npos) << what;
    EXPECT_NE(what.find("capacity"), std::string::npos) << what;
    EXPECT_FALSE(error.advice().empty());
  }
  // The device is still usable afterwards.
  Buffer small = cuda().allocate("after", Shape{1024}, DType::f32, Lifetime::scratch);
  cuda().fill(small, 1.0f);
  EXPECT_EQ(cuda().read_scalar(small), 1.0f);
}

TEST_F(CudaBackendObject, TimestampsMeasureStreamOrder) {
  Buffer big = cuda().allocate("big", Shape{int64_t{1} << 26}, DType::f32, Lifetime::scratch);
  const uint64_t start = cuda().record_timestamp();
  for (int i = 0; i < 10; ++i) cuda().fill(big, static_cast<float>(i));
  const uint64_t end = cuda().record_timestamp();
  const double ms = cuda().elapsed_ms(start, end);
  std::printf("[ info  ] 10 fills of 256 MiB: %.3f ms (%.0f GB/s)\n", ms, 10 * 268435456.0 / (ms * 1e6));
  EXPECT_GT(ms, 0.0);
}

}  // namespace
}  // namespace mxtrain::test
