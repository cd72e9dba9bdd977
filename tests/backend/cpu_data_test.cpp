// The cpu backend's data movement, whole-tensor ops, capabilities and memory: fill and copy
// in every storage dtype, f32/bf16/f16 conversion by round-to-nearest-even (specials included),
// sum and sum_of_squares against double sums, supports() for every op and dtype, the
// unsupported-dtype error, device properties, and the allocator's live and peak bytes.
#include <omp.h>

#include <cmath>
#include <limits>

#include "backend/cpu_op_checks.hpp"

namespace mxtrain::test {
namespace {

const DType kAllDTypes[] = {DType::f32, DType::bf16, DType::f16,  DType::e4m3, DType::e5m2,
                            DType::e8m0, DType::e2m1, DType::i32, DType::u8};

// ---- fill ----------------------------------------------------------------------------------

struct FillCase {
  const char* name;
  DType dtype;
  float value;
  uint32_t expected_bits;  // of one element, in the dtype's width
};

const FillCase kFillCases[] = {
    {"f32", DType::f32, -2.75f, 0xC0300000u},
    {"bf16", DType::bf16, 1.5f, 0x3FC0u},
    {"bf16_rounds_to_even", DType::bf16, 1.00390625f, 0x3F80u},  // 1 + 2^-8: a tie, to even
    {"f16", DType::f16, -1.5f, 0xBE00u},
    {"f16_overflow_to_infinity", DType::f16, 65520.0f, 0x7C00u},
    {"i32", DType::i32, -7.0f, 0xFFFFFFF9u},
    {"u8", DType::u8, 200.0f, 200u},
};

class CpuFill : public testing::TestWithParam<FillCase> {};

TEST_P(CpuFill, EveryElementHasTheValueInTheDtype) {
  const FillCase& c = GetParam();
  CpuBackend backend(2);
  const int64_t count = 3 * 8192 + 17;  // several parallel blocks of 8192 and a tail
  Buffer buffer = backend.allocate("fill", Shape{count}, c.dtype, Lifetime::scratch);
  backend.fill(buffer, c.value);
  std::vector<uint8_t> bytes(buffer.tensor().bytes());
  backend.copy_to_host(buffer, bytes.data());
  const size_t width = dtype_bytes(c.dtype, 1);
  for (int64_t i = 0; i < count; ++i) {
    uint32_t bits = 0;
    std::memcpy(&bits, bytes.data() + static_cast<size_t>(i) * width, width);
    ASSERT_EQ(bits, c.expected_bits) << "element " << i;
  }
}

INSTANTIATE_TEST_SUITE_P(, CpuFill, testing::ValuesIn(kFillCases), CaseName());

// ---- copy and conversions -------------------------------------------------------------------

std::vector<float> conversion_inputs() {
  std::vector<float> values = {0.0f, -0.0f, 1.0f, -1.0f / 3.0f, 1.00390625f, 1.01171875f, 1.00048828125f,
                               65504.0f, 65520.0f, -70000.0f, 1e-8f, 6e-8f, 3.0e38f, 1e-40f,
                               std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                               std::numeric_limits<float>::quiet_NaN()};
  std::vector<float> random = random_vector(20000, 201, -100.0f, 100.0f);
  values.insert(values.end(), random.begin(), random.end());
  return values;
}

bool same_value(float a, float b) { return (std::isnan(a) && std::isnan(b)) || float_bits(a) == float_bits(b); }

struct ConversionCase {
  const char* name;
  DType dtype;
  float (*round_trip)(float);
};

const ConversionCase kConversionCases[] = {
    {"bf16", DType::bf16, round_to_bf16},
    {"f16", DType::f16, round_to_f16},
};

class CpuConversion : public testing::TestWithParam<ConversionCase> {};

TEST_P(CpuConversion, RoundTripThroughDtypeRoundsToNearestEven) {
  const ConversionCase& c = GetParam();
  CpuBackend backend(2);
  const std::vector<float> values = conversion_inputs();
  Buffer narrow = upload(backend, values, Shape{static_cast<int64_t>(values.size())}, c.dtype);
  const std::vector<float> back = download(backend, narrow);
  for (size_t i = 0; i < values.size(); ++i)
    ASSERT_TRUE(same_value(back[i], c.round_trip(values[i]))) << "value " << values[i] << " gave " << back[i];
  // And the conversion is the identity on values already in the dtype.
  Buffer again = upload(backend, back, Shape{static_cast<int64_t>(back.size())}, c.dtype);
  const std::vector<float> twice = download(backend, again);
  for (size_t i = 0; i < back.size(); ++i) ASSERT_TRUE(same_value(twice[i], back[i]));
}

INSTANTIATE_TEST_SUITE_P(, CpuConversion, testing::ValuesIn(kConversionCases), CaseName());

TEST(CpuCopy, KnownRoundingResults) {
  CpuBackend backend(1);
  // value, bf16 bits, f16 bits (worked out by hand from the formats).
  const struct {
    float value;
    uint16_t bf16, f16;
  } known[] = {
      {1.0f, 0x3F80, 0x3C00},
      {1.00390625f, 0x3F80, 0x3C04},     // 1+2^-8: bf16 tie -> even (down); exact in f16
      {1.01171875f, 0x3F82, 0x3C0C},     // 1+3·2^-8: bf16 tie -> even (up)
      {1.00048828125f, 0x3F80, 0x3C00},  // 1+2^-11: f16 tie -> even (down)
      {65520.0f, 0x4780, 0x7C00},        // f16: rounds past 65504 to infinity
      {-0.0f, 0x8000, 0x8000},
  };
  for (const auto& k : known) {
    Buffer source = upload(backend, {k.value}, Shape{1});
    Buffer as_bf16 = backend.allocate("bf16", Shape{1}, DType::bf16, Lifetime::scratch);
    Buffer as_f16 = backend.allocate("f16", Shape{1}, DType::f16, Lifetime::scratch);
    backend.copy(source, as_bf16);
    backend.copy(source, as_f16);
    uint16_t bf16_bits = 0, f16_bits = 0;
    backend.copy_to_host(as_bf16, &bf16_bits);
    backend.copy_to_host(as_f16, &f16_bits);
    EXPECT_EQ(bf16_bits, k.bf16) << k.value;
    EXPECT_EQ(f16_bits, k.f16) << k.value;
  }
}

TEST(CpuCopy, Bf16ToF16ConvertsThroughTheValue) {
  CpuBackend backend(2);
  const std::vector<float> values = conversion_inputs();
  const int64_t count = static_cast<int64_t>(values.size());
  Buffer as_bf16 = upload(backend, values, Shape{count}, DType::bf16);
  Buffer as_f16 = backend.allocate("f16", Shape{count}, DType::f16, Lifetime::scratch);
  backend.copy(as_bf16, as_f16);
  std::vector<uint16_t> bf16_bits(values.size()), f16_bits(values.size());
  backend.copy_to_host(as_bf16, bf16_bits.data());
  backend.copy_to_host(as_f16, f16_bits.data());
  for (size_t i = 0; i < values.size(); ++i) {
    const uint16_t expected = float_to_f16(bf16_to_float(bf16_bits[i]));
    ASSERT_TRUE(same_value(f16_to_float(f16_bits[i]), f16_to_float(expected))) << values[i];
  }
}

TEST(CpuCopy, IntegerTensorsMoveExactly) {
  CpuBackend backend(2);
  const std::vector<int32_t> ids = {0, -1, 2147483647, -2147483647 - 1, 12345};
  Buffer a = upload_i32(backend, ids, Shape{5});
  Buffer b = backend.allocate("b", Shape{5}, DType::i32, Lifetime::scratch);
  backend.copy(a, b);
  std::vector<int32_t> back(5);
  backend.copy_to_host(b, back.data());
  EXPECT_EQ(back, ids);

  const std::vector<uint8_t> bytes = {0, 1, 127, 128, 255, 42, 7};
  Buffer u = backend.allocate("u", Shape{7}, DType::u8, Lifetime::scratch);
  backend.copy_from_host(bytes.data(), u);
  std::vector<uint8_t> bytes_back(7);
  backend.copy_to_host(u, bytes_back.data());
  EXPECT_EQ(bytes_back, bytes);
}

// ---- supports() and the unsupported error ---------------------------------------------------

// The ops of the cpu backend's FP32 family (the precision-recipe ops answer for themselves in
// quantize_cpu.cpp and its tests).
const OpKind kFp32Ops[] = {
    OpKind::fill, OpKind::copy, OpKind::copy_from_host, OpKind::copy_to_host, OpKind::embedding_forward,
    OpKind::embedding_backward, OpKind::norm_forward, OpKind::add_norm_forward, OpKind::norm_backward,
    OpKind::linear_forward, OpKind::linear_backward_input, OpKind::linear_backward_weight, OpKind::rope_forward,
    OpKind::rope_backward, OpKind::attention_forward, OpKind::attention_backward, OpKind::swiglu_forward,
    OpKind::swiglu_backward, OpKind::gelu_forward, OpKind::gelu_backward, OpKind::add, OpKind::cross_entropy,
    OpKind::sum, OpKind::sum_of_squares, OpKind::scale, OpKind::adamw,
};

bool is_linear(OpKind kind) {
  return kind == OpKind::linear_forward || kind == OpKind::linear_backward_input ||
         kind == OpKind::linear_backward_weight;
}
bool is_quantized(DType dtype) {
  return dtype == DType::e4m3 || dtype == DType::e5m2 || dtype == DType::e8m0 || dtype == DType::e2m1;
}

bool expected_support(OpKind kind, DType dtype) {
  if (dtype == DType::f32) return true;
  const bool data_movement =
      kind == OpKind::fill || kind == OpKind::copy || kind == OpKind::copy_from_host || kind == OpKind::copy_to_host;
  if (data_movement) return dtype == DType::bf16 || dtype == DType::f16 || dtype == DType::i32 || dtype == DType::u8;
  // backend.hpp: sum/sum_of_squares take x, and adamw its grad, in any float dtype.
  const bool reads_any_float = kind == OpKind::sum || kind == OpKind::sum_of_squares || kind == OpKind::adamw;
  return reads_any_float && (dtype == DType::bf16 || dtype == DType::f16);
}

// An allocation asked at an address (CachingAllocator::allocate's `at`) starts there when the
// free memory there holds it, the free memory before it staying free and reusable; where that
// memory is taken, it is placed by best fit as without the address.
TEST(CachingAllocator, PlacesABufferAtTheAddressAskedWhereThatMemoryIsFree) {
  CpuBackend backend(1);
  constexpr int64_t kMiB = 1 << 20;
  Buffer first = backend.allocate("first", Shape{8 * kMiB}, DType::u8, Lifetime::scratch);
  Buffer second = backend.allocate("second", Shape{8 * kMiB}, DType::u8, Lifetime::scratch);
  auto* const base = static_cast<uint8_t*>(first.tensor().data);
  const size_t live = backend.memory_stats().live_bytes;
  first.reset();
  Buffer inside = backend.allocate("inside", Shape{4 * kMiB}, DType::u8, Lifetime::scratch, base + 2 * kMiB);
  EXPECT_EQ(inside.tensor().data, base + 2 * kMiB);
  EXPECT_EQ(backend.memory_stats().live_bytes, live - 4 * kMiB);
  // The 2 MiB before it stay free.
  Buffer before = backend.allocate("before", Shape{2 * kMiB}, DType::u8, Lifetime::scratch, base);
  EXPECT_EQ(before.tensor().data, base);
  // Asked inside a live buffer: placed elsewhere.
  Buffer elsewhere =
      backend.allocate("elsewhere", Shape{kMiB + 512}, DType::u8, Lifetime::scratch, second.tensor().data);
  EXPECT_NE(elsewhere.tensor().data, second.tensor().data);
  // Small-pool buffers too.
  Buffer small = backend.allocate("small", Shape{256}, DType::f32, Lifetime::scratch);
  auto* const small_at = static_cast<uint8_t*>(small.tensor().data);
  small.reset();
  Buffer other = backend.allocate("other", Shape{8}, DType::f32, Lifetime::scratch);
  Buffer again = backend.allocate("again", Shape{8}, DType::f32, Lifetime::scratch, small_at + 512);
  EXPECT_EQ(again.tensor().data, small_at + 512);
}

TEST(CpuSupports, F32EverywhereNarrowStorageOnlyWhereDocumented) {
  CpuBackend backend(1);
  for (OpKind kind : kFp32Ops) {
    for (DType dtype : kAllDTypes) {
      if (is_linear(kind) && is_quantized(dtype)) continue;  // the quantized GEMMs: quantize_cpu.cpp
      EXPECT_EQ(backend.supports(kind, dtype), expected_support(kind, dtype))
          << op_kind_name(kind) << " " << dtype_name(dtype);
    }
  }
}

void expect_unsupported(const std::function<void()>& call, const char* op, const char* dtype) {
  try {
    call();
    ADD_FAILURE() << op << " accepted " << dtype;
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::unsupported) << error.what();
    EXPECT_NE(std::string(error.what()).find(op), std::string::npos) << error.what();
    EXPECT_NE(std::string(error.what()).find(dtype), std::string::npos) << error.what();
    EXPECT_FALSE(error.advice().empty());
  }
}

TEST(CpuSupports, UnsupportedDtypeThrowsNamingOpAndDtype) {
  CpuBackend backend(1);
  Buffer x16 = backend.allocate("x", Shape{2, 4}, DType::bf16, Lifetime::scratch);
  Buffer w16 = backend.allocate("w", Shape{3, 4}, DType::bf16, Lifetime::scratch);
  Buffer out16 = backend.allocate("out", Shape{2, 3}, DType::bf16, Lifetime::scratch);
  expect_unsupported([&] { backend.gemm({.role = GemmRole::forward, .a = x16, .b = w16,
                                         .out = out16}); }, "linear_forward", "bf16");
  Buffer h = backend.allocate("h", Shape{8}, DType::f16, Lifetime::scratch);
  expect_unsupported([&] { backend.add(h, h, h); }, "add", "f16");
  expect_unsupported([&] { backend.gelu_forward(h, h); }, "gelu_forward", "f16");
  Buffer fp8 = backend.allocate("fp8", Shape{8}, DType::e4m3, Lifetime::scratch);
  expect_unsupported([&] { backend.fill(fp8, 0.0f); }, "fill", "e4m3");
  Buffer ints = backend.allocate("ints", Shape{8}, DType::i32, Lifetime::scratch);
  Buffer floats = backend.allocate("floats", Shape{8}, DType::f32, Lifetime::scratch);
  expect_unsupported([&] { backend.copy(ints, floats); }, "copy", "i32");
}

// ---- properties, threads, memory ------------------------------------------------------------

TEST(CpuProperties, DescribeThreadsAndHostMemory) {
  CpuBackend backend(3);
  const DeviceProperties props = backend.properties();
  EXPECT_EQ(props.name, "cpu (3 threads)");
  EXPECT_EQ(props.multiprocessors, 3);
  EXPECT_EQ(props.compute_capability, 0);
  EXPECT_GT(props.memory_bytes, size_t{1} << 28);  // physical RAM
  EXPECT_EQ(props.memory_bytes, backend.memory_stats().capacity_bytes);
  EXPECT_EQ(backend.device(), Device::cpu);
  EXPECT_EQ(CpuBackend(0).threads(), omp_get_max_threads());
  EXPECT_THROW(CpuBackend(-1), Error);
}

TEST(CpuMemory, LiveAndPeakBytesFollowBuffers) {
  CpuBackend backend(1);
  const MemoryStats start = backend.memory_stats();
  Buffer a = backend.allocate("a", Shape{1000}, DType::f32, Lifetime::activation);   // 4000 -> 4096
  Buffer b = backend.allocate("b", Shape{3, 100}, DType::bf16, Lifetime::gradient);  // 600 -> 1024
  EXPECT_EQ(reinterpret_cast<uintptr_t>(a.tensor().data) % 64, 0u);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(b.tensor().data) % 64, 0u);
  MemoryStats two = backend.memory_stats();
  EXPECT_EQ(two.live_bytes - start.live_bytes, 4096u + 1024u);
  EXPECT_EQ(two.live_by_lifetime[static_cast<int>(Lifetime::activation)], 4096u);
  EXPECT_EQ(two.live_by_lifetime[static_cast<int>(Lifetime::gradient)], 1024u);
  EXPECT_GE(two.peak_live_bytes, two.live_bytes);
  EXPECT_GE(two.reserved_bytes, two.live_bytes);
  {
    Buffer big = backend.allocate("big", Shape{1 << 20}, DType::f32, Lifetime::scratch);  // 4 MiB: large pool
    backend.fill(big, 1.0f);  // the memory is real and writable
    EXPECT_EQ(backend.memory_stats().live_bytes, two.live_bytes + (size_t{4} << 20));
  }
  MemoryStats after = backend.memory_stats();
  EXPECT_EQ(after.live_bytes, two.live_bytes);
  EXPECT_EQ(after.peak_live_bytes, two.live_bytes + (size_t{4} << 20));
  a.reset();
  EXPECT_EQ(backend.memory_stats().live_bytes, two.live_bytes - 4096u);
  backend.reset_peak_memory();
  EXPECT_EQ(backend.memory_stats().peak_live_bytes, backend.memory_stats().live_bytes);
}

// ---- sum, sum_of_squares, add, scale ---------------------------------------------------------

struct SumCase {
  const char* name;
  int64_t count;
  DType dtype;
  bool squares, accumulate;
};

const SumCase kSumCases[] = {
    {"sum_small", 37, DType::f32, false, false},
    {"sum_blocks_accumulate", 3 * 8192 + 5, DType::f32, false, true},
    {"squares_blocks", 5 * 8192 + 1, DType::f32, true, false},
    {"squares_bf16_accumulate", 9000, DType::bf16, true, true},
    {"sum_f16", 100, DType::f16, false, false},
};

class CpuSum : public testing::TestWithParam<SumCase> {};

TEST_P(CpuSum, MatchesDoubleSumRoundedOnce) {
  const SumCase& c = GetParam();
  CpuBackend backend(2);
  const std::vector<float> values = random_vector(static_cast<size_t>(c.count), 211, -1.0f, 3.0f);
  Buffer x = upload(backend, values, Shape{c.count}, c.dtype);
  const std::vector<float> stored = download(backend, x);  // after rounding to the dtype
  const float before = 10.5f;
  Buffer out = upload(backend, {before}, Shape{1});
  if (c.squares) {
    backend.sum_of_squares(x, out, c.accumulate);
  } else {
    backend.sum(x, out, c.accumulate);
  }
  double expected = c.accumulate ? before : 0.0;
  for (float v : stored) expected += c.squares ? static_cast<double>(v) * v : v;
  // Double accumulation leaves only the final rounding to f32: half an ulp, 6e-8 relative.
  EXPECT_LE(std::fabs(backend.read_scalar(out) - expected), 6e-8 * std::fabs(expected));
}

INSTANTIATE_TEST_SUITE_P(, CpuSum, testing::ValuesIn(kSumCases), CaseName());

TEST(CpuElementwise, AddAndScaleAreOneRoundingEach) {
  CpuBackend backend(2);
  const int64_t count = 2 * 8192 + 3;
  const std::vector<float> a = random_vector(count, 221), b = random_vector(count, 222);
  Buffer ta = upload(backend, a, Shape{count}), tb = upload(backend, b, Shape{count});
  Buffer out = zeros(backend, Shape{count});
  backend.add(ta, tb, out);
  backend.scale(out, 0.375f);
  std::vector<float> expected(a.size());
  for (size_t i = 0; i < a.size(); ++i) expected[i] = (a[i] + b[i]) * 0.375f;
  EXPECT_TRUE(same_bits(download(backend, out), expected));
}

}  // namespace
}  // namespace mxtrain::test
