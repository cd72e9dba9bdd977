// Fake memory, and the replay of backend/cuda's in-op allocations. Each replayed allocation
// names the cuda source it mirrors; it has the same name, dtype, shape, lifetime and order as
// there, so the allocator sees the same request sequence.
#include "mxtrain/backend/dryrun/dryrun_backend.hpp"

#include <algorithm>
#include <cmath>

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

// reduce.cu column_reduction_chunks: about 64 rows per chunk, 1 to 256 chunks.
int64_t column_reduction_chunks(int64_t rows) { return std::max<int64_t>(1, std::min<int64_t>((rows + 63) / 64, 256)); }

int64_t round_up(int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; }

// norm.cu: the fused backward's row chunks (at least 32 rows, about 512 chunks) and the lanes
// it needs per row; 0 = too wide for it.
int64_t fused_norm_chunks(int64_t rows) {
  const int64_t rows_per_chunk = std::max<int64_t>(32, (rows + 511) / 512);
  return (rows + rows_per_chunk - 1) / rows_per_chunk;
}
int fused_norm_vectors_per_lane(int64_t cols, int width) {
  const int64_t needed = (cols / width + 31) / 32;
  return needed <= 4 ? 4 : needed <= 8 ? 8 : needed <= 16 ? 16 : 0;
}
bool aligned16(const Tensor& tensor) { return !tensor.defined() || (reinterpret_cast<uintptr_t>(tensor.data) & 15u) == 0; }


}  // namespace

DryrunBackend::DryrunBackend(size_t memory_bytes, std::string label, CudaAllocationModel cuda_model)
    : Backend(std::make_unique<FakeMemory>(memory_bytes, label.empty() ? "device" : label)),
      memory_bytes_(memory_bytes), label_(std::move(label)), cuda_(cuda_model) {
  if (!cuda_.enabled) return;
  // cuda_backend.cpp, constructor.
  gemm_workspace_ = allocate("cublaslt.workspace", Shape{static_cast<int64_t>(cuda_.gemm_workspace_bytes)}, DType::u8,
                             Lifetime::workspace);
  reduction_partials_ = allocate("reduction.partials", Shape{cuda_.reduction_partials}, DType::f32, Lifetime::workspace);
}

DeviceProperties DryrunBackend::properties() const {
  DeviceProperties props;
  props.name = "dryrun " + (label_.empty() ? std::string("device") : label_);
  props.memory_bytes = memory_bytes_;
  return props;
}

bool DryrunBackend::supports(OpKind kind, DType dtype) const {
  // Records any op the real backends implement (cuda_backend.cpp's supports()); quantized GEMMs
  // only in the formats the simulated GPU has, so the recipes emulate the rest as on that GPU.
  if (dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16) return true;
  const bool quantized = dtype == DType::e4m3 || dtype == DType::e5m2 || dtype == DType::e8m0 || dtype == DType::e2m1;
  auto native = [&](DType format) {
    return std::find(native_quantized_gemms_.begin(), native_quantized_gemms_.end(), format) !=
           native_quantized_gemms_.end();
  };
  switch (kind) {
    case OpKind::fill:
    case OpKind::copy:
    case OpKind::copy_from_host:
    case OpKind::copy_to_host: return dtype == DType::i32;
    case OpKind::quantize:
    case OpKind::dequantize:
    case OpKind::amax: return quantized;
    case OpKind::linear_forward:
    case OpKind::linear_backward_input:
    case OpKind::linear_backward_weight:
      // Per-tensor FP8 GEMMs take E4M3 and E5M2 operands alike.
      return native(dtype == DType::e5m2 ? DType::e4m3 : dtype);
    default: return false;
  }
}

void DryrunBackend::impl_gemm(const GemmArgs& args) {
  // cuda_backend.cpp impl_gemm: of the epilogues it may run apart, only DGELU allocates (its
  // scratch, skipped where cuBLASLt's epilogue applies); the weight gradient's scratch and the
  // NVFP4 GEMM's scalars as there.
  if (args.a.is_quantized()) {
    gemm_quantized(args.a.quantized);
  } else if (args.epilogue == GemmEpilogue::dgelu) {
    gemm_backward_input_gelu(args);
  } else if (has_separable_epilogue(args)) {
    gemm_epilogue_apart(args);
  } else if (args.role == GemmRole::backward_weight) {
    gemm_backward_weight(args.a.tensor, args.b.tensor, args.out, args.bias_gradient, args.accumulate);
  }
}

void DryrunBackend::gemm_backward_input_gelu(const GemmArgs& args) {
  const Tensor& dx = args.out;
  const bool epilogue = (dx.dtype == DType::bf16 || dx.dtype == DType::f16) && dx.cols() % 8 == 0;
  if (cuda_.enabled && epilogue) return;
  gemm_epilogue_apart(args);
}

void DryrunBackend::impl_column_sum(const Tensor& x, const Tensor&, bool) {
  // reduce.cu column_sum: f32 partial sums per row chunk.
  if (!cuda_.enabled || x.numel() == 0) return;
  Buffer partials = allocate("column_sum.partials", Shape{column_reduction_chunks(x.rows()), x.cols()}, DType::f32,
                             Lifetime::scratch);
}

void DryrunBackend::impl_adamw(const Tensor&, const Tensor& grad, const Tensor&, const Tensor&, const Tensor&,
                               const Tensor&, const AdamWArgs& args) {
  // adamw.cu with grad_norm_output: one f32 partial sum per block of 256 threads, a thread per
  // 8-element vector (the shards are whole, aligned groups).
  const int64_t n = grad.numel();
  if (!cuda_.enabled || n == 0 || args.grad_norm_output == AdamWArgs::NormOutput::none) return;
  const int64_t vectors = n % 8 == 0 ? n / 8 : n;
  Buffer partials = allocate("adamw.norm_partials", Shape{(vectors + 255) / 256}, DType::f32, Lifetime::scratch);
}

void DryrunBackend::impl_embedding_backward(const Tensor&, const Tensor& dout, const Tensor&, const Tensor&, int64_t) {
  // embedding.cu embedding_backward: sort buffers, then cub's temp storage.
  const int64_t n = dout.rows();
  if (!cuda_.enabled || n == 0) return;
  Buffer keys = allocate("embedding_backward.keys", Shape{2, n}, DType::i32, Lifetime::scratch);
  Buffer rows = allocate("embedding_backward.rows", Shape{2, n}, DType::i32, Lifetime::scratch);
  const auto temp_bytes = static_cast<int64_t>(std::ceil(cuda_.embedding_sort_bytes_per_token * static_cast<double>(n))) +
                          cuda_.embedding_sort_fixed_bytes;
  Buffer temp = allocate("embedding_backward.sort", Shape{temp_bytes}, DType::u8, Lifetime::scratch);
}

void DryrunBackend::impl_norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                                       const Tensor&, const Tensor&, const Tensor& dx, const Tensor& dweight,
                                       const Tensor& dbias, bool, bool, const Tensor&) {
  // norm.cu norm_backward: f32 partial column sums of dweight (and dbias for LayerNorm), from the
  // fused kernel's chunks where it applies, else from the two-kernel path's.
  if (!cuda_.enabled || x.numel() == 0) return;
  const int64_t rows = x.rows(), cols = x.cols();
  const bool with_bias = kind == NormKind::layer && dbias.defined();
  const bool vector = cols % 8 == 0 && aligned16(x) && aligned16(dout) && aligned16(dx) && aligned16(weight);
  const int lanes = fused_norm_vectors_per_lane(cols, vector ? 8 : 1);
  // fused_shared_bytes: 4 warps' rows of f32 sums (two rows each with a bias; rows of 8-wide
  // vectors padded to whole 256-column groups) within 96 KB.
  const int64_t row = vector ? (cols + 255) / 256 * 256 : cols;
  const bool fused = dweight.defined() && lanes > 0 && 4 * (with_bias ? 2 : 1) * 4 * row <= 96 * 1024;
  if (!fused && !dweight.defined()) return;
  const int64_t chunks = fused ? fused_norm_chunks(rows) : column_reduction_chunks(rows);
  Buffer partials =
      allocate("norm_backward.partials", Shape{with_bias ? 2 * chunks : chunks, cols}, DType::f32, Lifetime::scratch);
}

void DryrunBackend::gemm_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight,
                                         const Tensor& dbias, bool accumulate) {
  // cuda_backend.cpp gemm_backward_weight: an f32 product when f32 activations meet 16-bit
  // gradients; the bias gradient from BGRADB's f32 sums or reduce.cu column_sum.
  if (!cuda_.enabled) return;
  Buffer product;
  if (x.dtype == DType::f32 && dweight.dtype != DType::f32)
    product = allocate("linear.weight_grad", dweight.shape, DType::f32, Lifetime::scratch);
  if (!dbias.defined()) return;
  if (cuda_.bias_gradient_fused) {
    Buffer column_sums = allocate("linear.bias_grad", Shape{dout.cols()}, DType::f32, Lifetime::scratch);
    return;
  }
  impl_column_sum(dout, dbias, accumulate);
}

void DryrunBackend::gemm_quantized(const QuantizedTensor& a) {
  // cuda_backend.cpp: NVFP4 GEMMs take their two global scales from an f32 [2] scratch.
  if (!cuda_.enabled || a.spec.mode != ScalingMode::nvfp4) return;
  Buffer scalars = allocate("gemm.nvfp4_scalars", Shape{2}, DType::f32, Lifetime::scratch);
}

void DryrunBackend::impl_rope(const Tensor&, const AttentionShape& shape, float theta, bool, const Tensor&) {
  // cuda_backend.cpp rope_table: one f32 [2, seq, head_dim/2] table per (seq, head_dim, theta).
  if (!cuda_.enabled) return;
  auto key = std::make_tuple(shape.seq, shape.head_dim, theta);
  if (rope_tables_.count(key)) return;
  Buffer table = allocate(strf("rope.table.seq%lld.dim%lld", static_cast<long long>(shape.seq),
                               static_cast<long long>(shape.head_dim)),
                          Shape{2, shape.seq, shape.head_dim / 2}, DType::f32, Lifetime::workspace);
  rope_tables_.emplace(key, std::move(table));
}

void DryrunBackend::grow_attention_workspace(size_t bytes) {
  // attention.cpp workspace_for: replaced only by a larger request; 0 bytes allocates nothing.
  if (bytes <= attention_workspace_bytes_) return;
  attention_workspace_.reset();
  attention_workspace_ = allocate("cudnn.workspace", Shape{static_cast<int64_t>(bytes)}, DType::u8, Lifetime::workspace);
  attention_workspace_bytes_ = bytes;
}

void DryrunBackend::impl_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor&,
                                           const AttentionShape&) {
  if (!cuda_.enabled) return;
  Buffer qkv16, out16;
  if (qkv.dtype == DType::f32) {  // attention.cpp: bf16 staging copies for f32 activations
    qkv16 = allocate("attention.qkv_bf16", qkv.shape, DType::bf16, Lifetime::scratch);
    out16 = allocate("attention.out_bf16", out.shape, DType::bf16, Lifetime::scratch);
  }
  grow_attention_workspace(static_cast<size_t>(cuda_.attention_forward_workspace_bytes));
}

void DryrunBackend::impl_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor&,
                                            const Tensor& dqkv, const AttentionShape& shape) {
  if (!cuda_.enabled) return;
  Buffer dout16, qkv16, out16, dqkv16;
  if (qkv.dtype == DType::f32) {
    dout16 = allocate("attention.dout_bf16", dout.shape, DType::bf16, Lifetime::scratch);
    qkv16 = allocate("attention.qkv_bf16", qkv.shape, DType::bf16, Lifetime::scratch);
    out16 = allocate("attention.out_bf16", out.shape, DType::bf16, Lifetime::scratch);
    dqkv16 = allocate("attention.dqkv_bf16", dqkv.shape, DType::bf16, Lifetime::scratch);
  }
  const double rows = static_cast<double>(shape.batch * shape.heads * shape.seq);
  double bytes = static_cast<double>(cuda_.attention_backward_engine_bytes);
  if (cuda_.deterministic_attention) {
    // cudnn-frontend SDPA backward on sm_90, deterministic: a bf16 dP workspace instead of dQ accumulation.
    bytes += 2.0 * static_cast<double>(shape.batch * shape.heads) * static_cast<double>(round_up(shape.seq, 64)) *
             static_cast<double>(round_up(shape.seq, 128));
  } else {
    bytes += 4.0 * cuda_.attention_backward_dq_accum_f32 * rows * static_cast<double>(shape.head_dim);
  }
  bytes += 4.0 * cuda_.attention_backward_row_f32 * rows;
  if (shape.kv_heads < shape.heads) bytes += cuda_.attention_backward_gqa_bytes * rows * static_cast<double>(shape.head_dim);
  grow_attention_workspace(static_cast<size_t>(bytes));
}

}  // namespace mxtrain
