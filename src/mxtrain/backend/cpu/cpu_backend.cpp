// CpuBackend: construction, host memory, capabilities, data movement and the small
// whole-tensor ops. Invariant: host memory segments are 64-byte aligned (a cache line, and
// enough for any SIMD load) and never exceed physical RAM in total, so running out of memory is
// the allocator's clear out_of_memory error rather than a kill by the kernel's OOM handler.
// Whole-tensor sums are taken in double over fixed 8192-element blocks combined in block order,
// so they are bit-identical for any thread count.
#include "mxtrain/backend/cpu/cpu_backend.hpp"

#include <cblas.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mxtrain/backend/cpu/cpu_internal.hpp"

namespace mxtrain {
namespace cpu {

void throw_unsupported(const char* op, DType dtype) {
  throw Error(ErrorKind::unsupported,
              strf("the cpu backend has no %s for %s tensors", op, std::string(dtype_name(dtype)).c_str()),
              "the cpu backend computes in f32: set the activation and gradient dtypes to f32 when training on the "
              "cpu, or use the cuda backend");
}

void sgemm(int threads, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  MXTRAIN_ASSERT(k <= INT_MAX && lda <= INT_MAX && ldb <= INT_MAX && ldc <= INT_MAX,
                 "sgemm %lld x %lld x %lld exceeds OpenBLAS's 32-bit dimensions", static_cast<long long>(m),
                 static_cast<long long>(n), static_cast<long long>(k));
  // Process-global in OpenBLAS: every call from this backend runs single-threaded inside a tile.
  openblas_set_num_threads(1);
  const int64_t row_tiles = (m + kGemmTileRows - 1) / kGemmTileRows;
  const int64_t col_tiles = (n + kGemmTileCols - 1) / kGemmTileCols;
  const int64_t tiles = row_tiles * col_tiles;
#pragma omp parallel for num_threads(threads) schedule(static) if (tiles > 1 && threads > 1)
  for (int64_t tile = 0; tile < tiles; ++tile) {
    const int64_t row = tile / col_tiles * kGemmTileRows, col = tile % col_tiles * kGemmTileCols;
    const int64_t rows = std::min(kGemmTileRows, m - row), cols = std::min(kGemmTileCols, n - col);
    // Rows of op(A): rows of A, or columns of A when it is transposed; likewise columns of op(B).
    const float* a_tile = transpose_a ? a + row : a + row * lda;
    const float* b_tile = transpose_b ? b + col * ldb : b + col;
    cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans,
                static_cast<blasint>(rows), static_cast<blasint>(cols), static_cast<blasint>(k), alpha, a_tile,
                static_cast<blasint>(lda), b_tile, static_cast<blasint>(ldb), beta, c + row * ldc + col,
                static_cast<blasint>(ldc));
  }
}

}  // namespace cpu

namespace {

constexpr size_t kHostAlignment = 64;

size_t physical_memory_bytes() {
  long pages = sysconf(_SC_PHYS_PAGES);
  long page_size = sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page_size > 0 ? static_cast<size_t>(pages) * static_cast<size_t>(page_size) : 0;
}

// Aligned host memory, refused (nullptr) beyond physical RAM so the allocator can report it.
class HostMemory final : public MemorySource {
 public:
  HostMemory() : capacity_(physical_memory_bytes()) {}
  void* allocate_segment(size_t bytes) override {
    if (capacity_ && reserved_ + bytes > capacity_) return nullptr;
    size_t rounded = (bytes + kHostAlignment - 1) / kHostAlignment * kHostAlignment;
    void* pointer = std::aligned_alloc(kHostAlignment, rounded);
    if (pointer) reserved_ += bytes;
    return pointer;
  }
  void free_segment(void* pointer, size_t bytes) override {
    std::free(pointer);
    reserved_ -= bytes;
  }
  size_t capacity_bytes() const override { return capacity_; }
  const char* device_label() const override { return "host"; }

 private:
  size_t capacity_;
  size_t reserved_ = 0;  // guarded by the caching allocator's mutex
};

int resolve_threads(int threads) {
  MXTRAIN_REQUIRE(threads >= 0, config, strf("cpu threads must be >= 0, got %d", threads),
                  "set the cpu thread count to 0 (all cores) or a positive number");
  return threads > 0 ? threads : omp_get_max_threads();
}

bool is_host_storage(DType dtype) { return cpu::is_float_storage(dtype) || dtype == DType::i32 || dtype == DType::u8; }

template <typename T>
void fill_with(int threads, const Tensor& out, T value) {
  T* data = out.ptr<T>();
  cpu::parallel_blocks(threads, out.numel(), cpu::kElementBlock, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) data[i] = value;
  });
}

}  // namespace

CpuBackend::CpuBackend(int threads) : Backend(std::make_unique<HostMemory>()), threads_(resolve_threads(threads)) {}

DeviceProperties CpuBackend::properties() const {
  DeviceProperties props;
  props.name = strf("cpu (%d threads)", threads_);
  props.memory_bytes = memory_stats().capacity_bytes;
  props.compute_capability = 0;
  props.multiprocessors = threads_;
  return props;
}

bool CpuBackend::supports(OpKind kind, DType dtype) const {
  if (dtype == DType::f32) return true;
  const bool float16 = dtype == DType::bf16 || dtype == DType::f16;
  // Every quantized format, through numerics/ (quantize_cpu.cpp).
  const bool quantized = dtype == DType::e4m3 || dtype == DType::e5m2 || dtype == DType::e8m0 || dtype == DType::e2m1;
  switch (kind) {
    case OpKind::amax:
    case OpKind::quantize:
    case OpKind::dequantize:
      return quantized || float16;
    case OpKind::linear_forward:
    case OpKind::linear_backward_input:
    case OpKind::linear_backward_weight:
      return quantized;
    case OpKind::scale_update:
    case OpKind::column_sum:
      return false;
    case OpKind::fill:
    case OpKind::copy:
    case OpKind::copy_from_host:
    case OpKind::copy_to_host:
      return is_host_storage(dtype);
    // backend.hpp: sum and sum_of_squares read x, and adamw reads grad, in any float dtype.
    case OpKind::sum:
    case OpKind::sum_of_squares:
    case OpKind::adamw:
      return float16;
    case OpKind::embedding_forward:
    case OpKind::embedding_backward:
    case OpKind::norm_forward:
    case OpKind::add_norm_forward:
    case OpKind::norm_backward:
    case OpKind::rope_forward:
    case OpKind::rope_backward:
    case OpKind::attention_forward:
    case OpKind::attention_cached:
    case OpKind::attention_backward:
    case OpKind::swiglu_forward:
    case OpKind::swiglu_backward:
    case OpKind::gelu_forward:
    case OpKind::gelu_backward:
    case OpKind::add:
    case OpKind::cross_entropy:
    case OpKind::scale:
      return false;
  }
  return false;
}

void CpuBackend::impl_fill(const Tensor& out, float value) {
  switch (out.dtype) {
    case DType::f32: fill_with<float>(threads_, out, value); return;
    case DType::bf16: fill_with<uint16_t>(threads_, out, float_to_bf16(value)); return;
    case DType::f16: fill_with<uint16_t>(threads_, out, float_to_f16(value)); return;
    case DType::i32:
      MXTRAIN_ASSERT(value == std::nearbyint(value) && std::fabs(value) <= 2147483520.0f,
                     "fill: %g is not an i32 value", static_cast<double>(value));
      fill_with<int32_t>(threads_, out, static_cast<int32_t>(value));
      return;
    case DType::u8:
      MXTRAIN_ASSERT(value == std::nearbyint(value) && value >= 0 && value <= 255, "fill: %g is not a u8 value",
                     static_cast<double>(value));
      fill_with<uint8_t>(threads_, out, static_cast<uint8_t>(value));
      return;
    case DType::e4m3:
    case DType::e5m2:
    case DType::e8m0:
    case DType::e2m1:
      break;
  }
  cpu::throw_unsupported("fill", out.dtype);
}

void CpuBackend::impl_copy(const Tensor& source, const Tensor& out) {
  if (!is_host_storage(source.dtype)) cpu::throw_unsupported("copy", source.dtype);
  if (!is_host_storage(out.dtype)) cpu::throw_unsupported("copy", out.dtype);
  if (source.dtype == out.dtype) {
    const size_t element_bytes = dtype_bytes(out.dtype, 1);
    const char* from = static_cast<const char*>(source.data);
    char* to = static_cast<char*>(out.data);
    if (from == to) return;
    cpu::parallel_blocks(threads_, out.numel(), cpu::kElementBlock, [&](int64_t begin, int64_t end) {
      std::memmove(to + begin * element_bytes, from + begin * element_bytes,
                   static_cast<size_t>(end - begin) * element_bytes);
    });
    return;
  }
  if (!cpu::is_float_storage(source.dtype) || !cpu::is_float_storage(out.dtype)) {
    throw Error(ErrorKind::unsupported,
                strf("the cpu backend cannot copy %s into %s: copy converts only between f32, bf16 and f16",
                     std::string(dtype_name(source.dtype)).c_str(), std::string(dtype_name(out.dtype)).c_str()),
                "copy between tensors of the same dtype, or between float dtypes");
  }
  const DType to = out.dtype;
  cpu::parallel_blocks(threads_, out.numel(), cpu::kElementBlock, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float value = cpu::load_as_float(source.data, source.dtype, i);
      switch (to) {
        case DType::bf16: out.ptr<uint16_t>()[i] = float_to_bf16(value); break;
        case DType::f16: out.ptr<uint16_t>()[i] = float_to_f16(value); break;
        default: out.ptr<float>()[i] = value; break;
      }
    }
  });
}

void CpuBackend::impl_copy_from_host(const void* host, const Tensor& out) {
  if (!is_host_storage(out.dtype)) cpu::throw_unsupported("copy_from_host", out.dtype);
  if (out.numel() > 0) std::memcpy(out.data, host, out.bytes());
}

void CpuBackend::impl_copy_to_host(const Tensor& source, void* host) {
  if (!is_host_storage(source.dtype)) cpu::throw_unsupported("copy_to_host", source.dtype);
  if (source.numel() > 0) std::memcpy(host, source.data, source.bytes());
}

void CpuBackend::impl_add(const Tensor& a, const Tensor& b, const Tensor& out) {
  cpu::require_f32("add", {&a, &b, &out});
  const float* x = a.ptr<float>();
  const float* y = b.ptr<float>();
  float* z = out.ptr<float>();
  cpu::parallel_blocks(threads_, out.numel(), cpu::kElementBlock, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) z[i] = x[i] + y[i];
  });
}

void CpuBackend::impl_scale(const Tensor& x, float factor) {
  cpu::require_f32("scale", {&x});
  float* data = x.ptr<float>();
  cpu::parallel_blocks(threads_, x.numel(), cpu::kElementBlock, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) data[i] *= factor;
  });
}

void CpuBackend::impl_sum(const Tensor& x, const Tensor& out, bool accumulate, bool squares) {
  const char* op = squares ? "sum_of_squares" : "sum";
  if (!cpu::is_float_storage(x.dtype)) cpu::throw_unsupported(op, x.dtype);
  cpu::require_f32(op, {&out});
  MXTRAIN_ASSERT(x.is_contiguous(), "%s: %s must be contiguous", op, x.describe().c_str());
  const int64_t count = x.numel();
  const int64_t blocks = (count + cpu::kElementBlock - 1) / cpu::kElementBlock;
  std::vector<double> partials(static_cast<size_t>(blocks), 0.0);
  cpu::parallel_blocks(threads_, count, cpu::kElementBlock, [&](int64_t begin, int64_t end) {
    double total = 0;
    for (int64_t i = begin; i < end; ++i) {
      double value = cpu::load_as_float(x.data, x.dtype, i);
      total += squares ? value * value : value;
    }
    partials[static_cast<size_t>(begin / cpu::kElementBlock)] = total;
  });
  double total = accumulate ? static_cast<double>(out.ptr<float>()[0]) : 0.0;
  for (double partial : partials) total += partial;
  out.ptr<float>()[0] = static_cast<float>(total);
}

}  // namespace mxtrain
