// Fake memory, and backend/cuda's in-op allocations: each op records the list
// backend/private_buffers.hpp returns for its arguments, in the order backend/cuda allocates
// it, with the device facts from the model (CudaAllocationModel).
#include "mxtrain/backend/dryrun/dryrun_backend.hpp"

#include <algorithm>
#include <cmath>

#include "mxtrain/backend/private_buffers.hpp"
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

DryrunBackend::DryrunBackend(size_t memory_bytes, std::string label, CudaAllocationModel cuda_model)
    : Backend(std::make_unique<FakeMemory>(memory_bytes, label.empty() ? "device" : label)),
      memory_bytes_(memory_bytes), label_(std::move(label)), cuda_(cuda_model) {
  if (!cuda_.enabled) return;
  workspaces_ = private_buffers::allocate_private(*this, private_buffers::backend_workspaces());
}

int64_t CudaAllocationModel::attention_workspace_bytes(const AttentionShape& shape, DType io, bool backward) const {
  const bool deterministic = backward && deterministic_attention;
  if (backward && flash_attention_4_backward) return private_buffers::flash_attention_4_workspace(shape).bytes();
  if (auto value = recorded.find(private_buffers::attention_workspace_fact(shape, io, backward, deterministic)))
    return *value;
  if (!backward) return attention_forward_workspace_bytes;
  const double rows = static_cast<double>(shape.batch * shape.heads * shape.seq);
  double bytes = static_cast<double>(attention_backward_engine_bytes);
  if (deterministic) {
    // cudnn-frontend SDPA backward on sm_90, deterministic: a bf16 dP workspace instead of dQ accumulation.
    auto round_up = [](int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; };
    bytes += 2.0 * static_cast<double>(shape.batch * shape.heads) * static_cast<double>(round_up(shape.seq, 64)) *
             static_cast<double>(round_up(shape.seq, 128));
  } else {
    bytes += 4.0 * attention_backward_dq_accum_f32 * rows * static_cast<double>(shape.head_dim);
  }
  bytes += 4.0 * attention_backward_row_f32 * rows;
  if (shape.kv_heads < shape.heads) bytes += attention_backward_gqa_bytes * rows * static_cast<double>(shape.head_dim);
  return static_cast<int64_t>(static_cast<size_t>(bytes));
}

int64_t CudaAllocationModel::embedding_sort_bytes(int64_t tokens, int key_bits) const {
  if (auto value = recorded.find(private_buffers::embedding_sort_fact(tokens, key_bits))) return *value;
  return static_cast<int64_t>(std::ceil(embedding_sort_bytes_per_token * static_cast<double>(tokens))) +
         embedding_sort_fixed_bytes;
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
  // As CudaBackend::gemm_backward_input_gelu: the bias gradient's partials first, whichever
  // kernel fills them.
  std::vector<Buffer> partials;
  if (cuda_.enabled && args.bias_gradient.defined())
    partials = private_buffers::allocate_private(*this, private_buffers::dgelu_bias_gradient(dx));
  if (cuda_.enabled && epilogue) return;
  gemm_epilogue_apart(args);
}

void DryrunBackend::impl_column_sum(const Tensor& x, const Tensor&, bool) {
  if (!cuda_.enabled) return;
  std::vector<Buffer> scratch = private_buffers::allocate_private(*this, private_buffers::column_sum(x));
}

void DryrunBackend::impl_qkv_bias_gradient(const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor&,
                                           const Tensor&, bool) {
  if (!cuda_.enabled) return;
  // The CUDA backend's dq partial sums (cuda_kernels::qkv_bias_gradient).
  std::vector<Buffer> scratch =
      private_buffers::allocate_private(*this, private_buffers::qkv_bias_gradient(dqkv, out_bias_grad.numel()));
}

void DryrunBackend::impl_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                               const Tensor& compute_copy, const Tensor&, const AdamWArgs& args) {
  if (!cuda_.enabled) return;
  const private_buffers::AdamwPlan plan = private_buffers::adamw(param, grad, m, v, compute_copy, args);
  std::vector<Buffer> scratch = private_buffers::allocate_private(*this, plan.buffers);
}

void DryrunBackend::impl_embedding_backward(const Tensor&, const Tensor& dout, const Tensor& dtoken_table,
                                            const Tensor&, int64_t) {
  const int64_t n = dout.rows();
  if (!cuda_.enabled || n == 0) return;
  const int bits = private_buffers::embedding_sort_key_bits(dtoken_table.rows());
  const int64_t sort_bytes = cuda_.embedding_sort_bytes(n, bits);
  facts_used_.record(private_buffers::embedding_sort_fact(n, bits), sort_bytes);
  std::vector<Buffer> scratch = private_buffers::allocate_private(
      *this, private_buffers::embedding_backward(n, static_cast<size_t>(sort_bytes)));
}

void DryrunBackend::impl_norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                                       const Tensor&, const Tensor&, const Tensor& dx, const Tensor& dweight,
                                       const Tensor& dbias, bool, bool, const Tensor&,
                                       const DxColumnSums& dx_sums) {
  if (!cuda_.enabled) return;
  const private_buffers::NormBackwardPlan plan =
      private_buffers::norm_backward(kind, dout, x, weight, dx, dweight, dbias, dx_sums);
  // As backend/cuda runs it: dx's column sums that the fused kernel does not take run as
  // column-sum kernels, the incoming one first and the outgoing one last.
  if (!plan.dx_sums && dx_sums.in.defined()) impl_column_sum(dx, dx_sums.in, dx_sums.accumulate_in);
  {
    std::vector<Buffer> scratch = private_buffers::allocate_private(*this, plan.buffers);
  }
  if (!plan.dx_sums && dx_sums.out.defined()) impl_column_sum(dx, dx_sums.out, dx_sums.accumulate_out);
}

void DryrunBackend::gemm_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight,
                                         const Tensor& dbias, bool accumulate) {
  if (!cuda_.enabled || x.rows() == 0) return;
  std::vector<Buffer> scratch = private_buffers::allocate_private(
      *this, private_buffers::linear_backward_weight(dout, x, dweight, dbias, cuda_.bias_gradient_fused));
  if (dbias.defined() && !cuda_.bias_gradient_fused) impl_column_sum(dout, dbias, accumulate);
}

void DryrunBackend::gemm_quantized(const QuantizedTensor& a) {
  if (!cuda_.enabled) return;
  std::vector<Buffer> scratch = private_buffers::allocate_private(*this, private_buffers::linear_quantized(a.spec.mode));
}

void DryrunBackend::impl_rope(const Tensor&, const AttentionShape& shape, const RopeSpec& rope, bool, const Tensor&) {
  if (!cuda_.enabled) return;
  const int64_t positions = private_buffers::rope_table_positions(shape.seq, shape.position_offset);
  auto key = std::make_tuple(positions, shape.head_dim, rope);
  if (rope_tables_.count(key)) return;
  rope_tables_.emplace(key, private_buffers::allocate_private(*this, private_buffers::rope_table(positions, shape.head_dim)));
}

// cuda_backend.cpp: the cached attention kernel holds no buffers of its own.
void DryrunBackend::impl_attention_cached(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                          const AttentionShape&) {}

void DryrunBackend::check_attention_backward(const AttentionShape& shape, DType activations) const {
  if (!cuda_.enabled || !cuda_.flash_attention_4_backward) return;
  const std::string why = private_buffers::flash_attention_4_unsupported(shape, activations);
  if (!why.empty())
    throw Error(ErrorKind::unsupported,
                strf("train.attention_backward = flash-attention-4 cannot run attention with head_dim %lld, seq %lld: ",
                     static_cast<long long>(shape.head_dim), static_cast<long long>(shape.seq)) +
                    why,
                "set train.attention_backward = cudnn");
}

void DryrunBackend::grow_attention_workspace(const AttentionShape& shape, DType io, bool backward) {
  const int64_t bytes = cuda_.attention_workspace_bytes(shape, io, backward);
  if (!backward || !cuda_.flash_attention_4_backward)  // FlashAttention-4's is a formula, not a fact
    facts_used_.record(private_buffers::attention_workspace_fact(shape, io, backward,
                                                                 backward && cuda_.deterministic_attention),
                       bytes);
  if (auto grown = private_buffers::attention_workspace(attention_workspace_bytes_, bytes)) {
    attention_workspace_.reset();
    attention_workspace_ = private_buffers::allocate_private(*this, *grown);
    attention_workspace_bytes_ = grown->bytes();
  }
}

void DryrunBackend::impl_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor&,
                                           const AttentionShape& shape) {
  if (!cuda_.enabled) return;
  std::vector<Buffer> staging = private_buffers::allocate_private(*this, private_buffers::attention_forward(qkv, out));
  grow_attention_workspace(shape, qkv.dtype == DType::f32 ? DType::bf16 : qkv.dtype, false);
}

void DryrunBackend::impl_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor&,
                                            const Tensor& dqkv, const AttentionShape& shape) {
  if (!cuda_.enabled) return;
  std::vector<Buffer> staging =
      private_buffers::allocate_private(*this, private_buffers::attention_backward(dout, qkv, out, dqkv));
  grow_attention_workspace(shape, qkv.dtype == DType::f32 ? DType::bf16 : qkv.dtype, true);
}

}  // namespace mxtrain
