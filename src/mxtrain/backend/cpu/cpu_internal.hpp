// Helpers shared by the CPU op files (private to backend/cpu/). The trick they all rely on for
// determinism: work is split into pieces whose boundaries depend only on the shape (rows, a fixed
// row chunk, a fixed element block), never on the thread count, and any partial results are
// combined serially in piece order. OpenMP only decides which thread runs which piece.
#pragma once
#include <cstdint>
#include <initializer_list>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/core/error.hpp"

namespace mxtrain::cpu {

// Rows per partial in reductions over rows (norm dweight/dbias).
constexpr int64_t kReductionChunkRows = 32;
// Elements per partial in whole-tensor reductions (sum, sum_of_squares) and per parallel block
// in elementwise ops.
constexpr int64_t kElementBlock = 8192;

// Throws Error(unsupported) naming the op and the dtype.
[[noreturn]] void throw_unsupported(const char* op, DType dtype);

// Every defined tensor in the list must be f32; the CPU computes in FP32 only.
inline void require_f32(const char* op, std::initializer_list<const Tensor*> tensors) {
  for (const Tensor* tensor : tensors)
    if (tensor->defined() && tensor->dtype != DType::f32) throw_unsupported(op, tensor->dtype);
}

inline bool is_float_storage(DType dtype) { return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16; }

// Element `index` of an f32/bf16/f16 array as float (exact: both 16-bit formats widen exactly).
inline float load_as_float(const void* data, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::bf16: return bf16_to_float(static_cast<const uint16_t*>(data)[index]);
    case DType::f16: return f16_to_float(static_cast<const uint16_t*>(data)[index]);
    default: return static_cast<const float*>(data)[index];
  }
}

// C[m,n] = alpha · op(A)[m,k] · op(B)[k,n] + beta · C, row-major, through OpenBLAS. Call it
// outside OpenMP regions: it opens its own. OpenBLAS's own threading is not used, because its
// results depend on its thread count (0.3.21 on Zen: with 1 and 2 threads about 3% of the
// elements differ in the last bit, in the columns next to its partition boundary). Instead C is
// cut into fixed kGemmTileRows × kGemmTileCols tiles, set by the shape alone, and each tile is one
// single-threaded cblas_sgemm over the whole k; OpenMP spreads the tiles over `threads`. A tile's
// result is the same whichever thread runs it, so C is bit-identical for any thread count.
constexpr int64_t kGemmTileRows = 128;
constexpr int64_t kGemmTileCols = 512;
void sgemm(int threads, bool transpose_a, bool transpose_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Runs body(begin, end) over [0, count) in blocks of `block` (the last one shorter), blocks
// shared among `threads` OpenMP threads. Block boundaries depend on count and block only.
template <typename Body>
void parallel_blocks(int threads, int64_t count, int64_t block, Body&& body) {
  const int64_t blocks = (count + block - 1) / block;
#pragma omp parallel for num_threads(threads) schedule(static) if (blocks > 1 && threads > 1)
  for (int64_t index = 0; index < blocks; ++index) {
    const int64_t begin = index * block;
    body(begin, begin + block < count ? begin + block : count);
  }
}

// Runs body(row) for every row in [0, rows), rows shared among threads.
template <typename Body>
void parallel_rows(int threads, int64_t rows, Body&& body) {
#pragma omp parallel for num_threads(threads) schedule(static) if (rows > 1 && threads > 1)
  for (int64_t row = 0; row < rows; ++row) body(row);
}

}  // namespace mxtrain::cpu
