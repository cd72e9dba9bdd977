// The non-virtual half of Backend: argument checks and the one table of FLOP and byte
// formulas that every backend reports through its TraceObserver.
#include "mxtrain/backend/backend.hpp"

#include <chrono>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

const char* op_kind_name(OpKind kind) {
  switch (kind) {
#define MXTRAIN_NAME_ENTRY(name) \
  case OpKind::name:             \
    return #name;
    MXTRAIN_OP_KINDS(MXTRAIN_NAME_ENTRY)
#undef MXTRAIN_NAME_ENTRY
  }
  return "?";
}

const char* phase_name(Phase phase) {
  switch (phase) {
    case Phase::forward: return "forward";
    case Phase::backward: return "backward";
    case Phase::recompute: return "recompute";
    case Phase::optimizer: return "optimizer";
    case Phase::other: return "other";
  }
  return "?";
}

Backend::Backend(std::unique_ptr<MemorySource> source)
    : allocator_(std::make_unique<CachingAllocator>(std::move(source))) {}

Backend::~Backend() = default;

uint64_t Backend::record_timestamp() {
  synchronize();
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
}

double Backend::elapsed_ms(uint64_t start, uint64_t end) { return static_cast<double>(end - start) / 1e6; }

Buffer Backend::allocate(const std::string& name, Shape shape, DType dtype, Lifetime lifetime) {
  size_t bytes = dtype_bytes(dtype, static_cast<size_t>(shape.numel()));
  CachingAllocator::Allocation allocation = allocator_->allocate(bytes, name, lifetime);
  if (observer_) {
    observer_->on_allocation(AllocationEvent{name, lifetime, bytes, CachingAllocator::round_size(bytes), false,
                                             allocator_->stats().live_bytes});
  }
  return Buffer(allocator_.get(), allocation.block, Tensor(allocation.pointer, shape, dtype, device()));
}

void Backend::record(const OpRecord& op) {
  if (observer_) observer_->on_op(op);
}

namespace {

double b(const Tensor& tensor) { return tensor.defined() ? static_cast<double>(tensor.bytes()) : 0.0; }
double n(const Tensor& tensor) { return tensor.defined() ? static_cast<double>(tensor.numel()) : 0.0; }

void require_same_shape(const Tensor& a, const Tensor& c, const char* op) {
  MXTRAIN_ASSERT(a.shape == c.shape, "%s: shapes %s and %s differ", op, a.shape.str().c_str(), c.shape.str().c_str());
}

void require_contiguous(const Tensor& tensor, const char* op) {
  MXTRAIN_ASSERT(!tensor.defined() || tensor.is_contiguous(), "%s: %s must be contiguous", op,
                 tensor.describe().c_str());
}

}  // namespace

void Backend::fill(const Tensor& out, float value) {
  require_contiguous(out, "fill");
  record({OpKind::fill, phase_, out.dtype, 0, b(out)});
  impl_fill(out, value);
}

void Backend::copy(const Tensor& source, const Tensor& out) {
  MXTRAIN_ASSERT(source.numel() == out.numel(), "copy: %s -> %s", source.describe().c_str(), out.describe().c_str());
  require_contiguous(source, "copy");
  require_contiguous(out, "copy");
  record({OpKind::copy, phase_, out.dtype, 0, b(source) + b(out)});
  impl_copy(source, out);
}

void Backend::copy_from_host(const void* host, const Tensor& out) {
  require_contiguous(out, "copy_from_host");
  record({OpKind::copy_from_host, phase_, out.dtype, 0, b(out)});
  impl_copy_from_host(host, out);
}

void Backend::copy_to_host(const Tensor& source, void* host) {
  require_contiguous(source, "copy_to_host");
  record({OpKind::copy_to_host, phase_, source.dtype, 0, b(source)});
  impl_copy_to_host(source, host);
}

float Backend::read_scalar(const Tensor& source) {
  MXTRAIN_ASSERT(source.dtype == DType::f32, "read_scalar needs f32, got %s", source.describe().c_str());
  if (device() == Device::none) return 0.0f;
  float value = 0;
  impl_copy_to_host(source.slice_flat(0, Shape{1}), &value);
  return value;
}

void Backend::embedding_forward(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                                const Tensor& out, int64_t seq_len) {
  MXTRAIN_ASSERT(tokens.dtype == DType::i32 && tokens.numel() == out.rows() && out.cols() == token_table.cols(),
                 "embedding_forward: tokens %s, table %s, out %s", tokens.describe().c_str(),
                 token_table.describe().c_str(), out.describe().c_str());
  MXTRAIN_ASSERT(!position_table.defined() || position_table.cols() == out.cols(), "embedding_forward: positions");
  MXTRAIN_ASSERT(seq_len > 0 && out.rows() % seq_len == 0, "embedding_forward: rows %% seq_len");
  double row_bytes = b(out) * (position_table.defined() ? 3.0 : 2.0);
  record({OpKind::embedding_forward, phase_, out.dtype, n(out) * (position_table.defined() ? 1 : 0),
          b(tokens) + row_bytes});
  impl_embedding_forward(tokens, token_table, position_table, out, seq_len);
}

void Backend::embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                                 const Tensor& dposition_table, int64_t seq_len) {
  MXTRAIN_ASSERT(tokens.dtype == DType::i32 && tokens.numel() == dout.rows() && dout.cols() == dtoken_table.cols(),
                 "embedding_backward: tokens %s, dout %s, dtable %s", tokens.describe().c_str(),
                 dout.describe().c_str(), dtoken_table.describe().c_str());
  double grad_row_bytes = static_cast<double>(dtype_bytes(dtoken_table.dtype, static_cast<size_t>(dout.numel())));
  double per_table = 2 * grad_row_bytes;
  record({OpKind::embedding_backward, phase_, dout.dtype, n(dout) * (dposition_table.defined() ? 2 : 1),
          b(tokens) + b(dout) + per_table * (dposition_table.defined() ? 2 : 1)});
  impl_embedding_backward(tokens, dout, dtoken_table, dposition_table, seq_len);
}

static double norm_flops(NormKind kind, double elements) { return (kind == NormKind::rms ? 4.0 : 7.0) * elements; }

void Backend::norm_forward(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& out, const Tensor& mean, const Tensor& rstd, float eps) {
  require_same_shape(x, out, "norm_forward");
  MXTRAIN_ASSERT(weight.numel() == x.cols() && rstd.numel() == x.rows(), "norm_forward: weight/rstd shape");
  MXTRAIN_ASSERT(kind == NormKind::rms || (mean.numel() == x.rows() && bias.numel() == x.cols()),
                 "layer norm needs mean and bias");
  record({OpKind::norm_forward, phase_, x.dtype, norm_flops(kind, n(x)),
          b(x) + b(out) + b(weight) + b(bias) + b(mean) + b(rstd)});
  impl_norm_forward(kind, x, weight, bias, out, mean, rstd, eps);
}

void Backend::add_norm_forward(NormKind kind, const Tensor& a, const Tensor& bb, const Tensor& sum,
                               const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& mean,
                               const Tensor& rstd, float eps) {
  require_same_shape(a, bb, "add_norm_forward");
  require_same_shape(a, sum, "add_norm_forward");
  require_same_shape(a, out, "add_norm_forward");
  MXTRAIN_ASSERT(weight.numel() == a.cols() && rstd.numel() == a.rows(), "add_norm_forward: weight/rstd shape");
  record({OpKind::add_norm_forward, phase_, a.dtype, norm_flops(kind, n(a)) + n(a),
          b(a) + b(bb) + b(sum) + b(out) + b(weight) + b(bias) + b(mean) + b(rstd)});
  impl_add_norm_forward(kind, a, bb, sum, weight, bias, out, mean, rstd, eps);
}

void Backend::impl_add_norm_forward(NormKind kind, const Tensor& a, const Tensor& bb, const Tensor& sum,
                                    const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& mean,
                                    const Tensor& rstd, float eps) {
  impl_add(a, bb, sum);
  impl_norm_forward(kind, sum, weight, bias, out, mean, rstd, eps);
}

void Backend::norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                            const Tensor& dbias, bool accumulate_dx) {
  require_same_shape(dout, x, "norm_backward");
  require_same_shape(dout, dx, "norm_backward");
  MXTRAIN_ASSERT(dweight.numel() == x.cols(), "norm_backward: dweight shape");
  record({OpKind::norm_backward, phase_, x.dtype, 2 * norm_flops(kind, n(x)),
          b(dout) + b(x) + b(dx) * (accumulate_dx ? 2 : 1) + b(weight) + 2 * b(dweight) + 2 * b(dbias) + b(mean) +
              b(rstd)});
  impl_norm_backward(kind, dout, x, weight, mean, rstd, dx, dweight, dbias, accumulate_dx);
}

void Backend::linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out) {
  MXTRAIN_ASSERT(weight.rank() == 2 && x.cols() == weight.size(1) && out.cols() == weight.size(0) &&
                     out.rows() == x.rows(),
                 "linear_forward: x %s, weight %s, out %s", x.describe().c_str(), weight.describe().c_str(),
                 out.describe().c_str());
  MXTRAIN_ASSERT(!bias.defined() || bias.numel() == weight.size(0), "linear_forward: bias shape");
  OpRecord op{OpKind::linear_forward, phase_, x.dtype, 2.0 * n(out) * static_cast<double>(x.cols()),
              b(x) + b(weight) + b(out) + b(bias)};
  if (bias.defined()) op.flops += n(out);
  op.m = out.rows();
  op.n = out.cols();
  op.k = x.cols();
  record(op);
  impl_linear_forward(x, weight, bias, out);
}

void Backend::linear_backward_input(const Tensor& dout, const Tensor& weight, const Tensor& dx, bool accumulate) {
  MXTRAIN_ASSERT(weight.rank() == 2 && dout.cols() == weight.size(0) && dx.cols() == weight.size(1) &&
                     dx.rows() == dout.rows(),
                 "linear_backward_input: dout %s, weight %s, dx %s", dout.describe().c_str(),
                 weight.describe().c_str(), dx.describe().c_str());
  OpRecord op{OpKind::linear_backward_input, phase_, dout.dtype, 2.0 * n(dx) * static_cast<double>(dout.cols()),
              b(dout) + b(weight) + b(dx) * (accumulate ? 2 : 1)};
  op.m = dx.rows();
  op.n = dx.cols();
  op.k = dout.cols();
  record(op);
  impl_linear_backward_input(dout, weight, dx, accumulate);
}

void Backend::linear_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight, const Tensor& dbias) {
  MXTRAIN_ASSERT(dweight.rank() == 2 && dout.cols() == dweight.size(0) && x.cols() == dweight.size(1) &&
                     x.rows() == dout.rows(),
                 "linear_backward_weight: dout %s, x %s, dweight %s", dout.describe().c_str(), x.describe().c_str(),
                 dweight.describe().c_str());
  OpRecord op{OpKind::linear_backward_weight, phase_, dout.dtype, 2.0 * n(dweight) * static_cast<double>(x.rows()),
              b(dout) + b(x) + 2 * b(dweight) + 2 * b(dbias)};
  if (dbias.defined()) op.flops += n(dout);
  op.m = dweight.size(0);
  op.n = dweight.size(1);
  op.k = x.rows();
  record(op);
  impl_linear_backward_weight(dout, x, dweight, dbias);
}

static void check_attention_shape(const AttentionShape& shape, const Tensor& qkv, const char* op) {
  MXTRAIN_ASSERT(shape.heads > 0 && shape.kv_heads > 0 && shape.heads % shape.kv_heads == 0,
                 "%s: heads %lld not a multiple of kv_heads %lld", op, static_cast<long long>(shape.heads),
                 static_cast<long long>(shape.kv_heads));
  MXTRAIN_ASSERT(qkv.rows() == shape.batch * shape.seq && qkv.cols() == shape.qkv_cols(), "%s: qkv %s", op,
                 qkv.describe().c_str());
}

void Backend::rope_forward(const Tensor& qkv, const AttentionShape& shape, float theta) {
  check_attention_shape(shape, qkv, "rope_forward");
  double rotated = static_cast<double>(qkv.rows() * (shape.heads + shape.kv_heads) * shape.head_dim);
  record({OpKind::rope_forward, phase_, qkv.dtype, 3 * rotated,
          2 * rotated * dtype_bits(qkv.dtype) / 8.0});
  impl_rope(qkv, shape, theta, false);
}

void Backend::rope_backward(const Tensor& dqkv, const AttentionShape& shape, float theta) {
  check_attention_shape(shape, dqkv, "rope_backward");
  double rotated = static_cast<double>(dqkv.rows() * (shape.heads + shape.kv_heads) * shape.head_dim);
  record({OpKind::rope_backward, phase_, dqkv.dtype, 3 * rotated, 2 * rotated * dtype_bits(dqkv.dtype) / 8.0});
  impl_rope(dqkv, shape, theta, true);
}

// Causal attention does half of the full T×T work: QKᵀ and PV forward (2 GEMMs), and in
// backward the recomputed QKᵀ plus dV, dP, dQ, dK (5 GEMMs).
static double attention_gemm_flops(const AttentionShape& shape) {
  return 2.0 * static_cast<double>(shape.batch * shape.heads) * static_cast<double>(shape.seq) *
         static_cast<double>(shape.seq) * static_cast<double>(shape.head_dim) * 0.5;
}

void Backend::attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const AttentionShape& shape) {
  check_attention_shape(shape, qkv, "attention_forward");
  MXTRAIN_ASSERT(out.rows() == qkv.rows() && out.cols() == shape.heads * shape.head_dim, "attention_forward: out");
  MXTRAIN_ASSERT(lse.dtype == DType::f32 && lse.numel() == shape.batch * shape.heads * shape.seq,
                 "attention_forward: lse");
  OpRecord op{OpKind::attention_forward, phase_, qkv.dtype, 2 * attention_gemm_flops(shape),
              b(qkv) + b(out) + b(lse)};
  op.m = shape.batch * shape.heads;
  op.n = shape.seq;
  op.k = shape.head_dim;
  record(op);
  impl_attention_forward(qkv, out, lse, shape);
}

void Backend::attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                 const Tensor& dqkv, const AttentionShape& shape) {
  check_attention_shape(shape, qkv, "attention_backward");
  require_same_shape(qkv, dqkv, "attention_backward");
  require_same_shape(dout, out, "attention_backward");
  OpRecord op{OpKind::attention_backward, phase_, qkv.dtype, 5 * attention_gemm_flops(shape),
              b(dout) + b(qkv) + b(out) + b(lse) + b(dqkv)};
  op.m = shape.batch * shape.heads;
  op.n = shape.seq;
  op.k = shape.head_dim;
  record(op);
  impl_attention_backward(dout, qkv, out, lse, dqkv, shape);
}

void Backend::swiglu_forward(const Tensor& gate_up, const Tensor& out) {
  MXTRAIN_ASSERT(gate_up.rows() == out.rows() && gate_up.cols() == 2 * out.cols(), "swiglu_forward: %s -> %s",
                 gate_up.describe().c_str(), out.describe().c_str());
  record({OpKind::swiglu_forward, phase_, out.dtype, 6 * n(out), b(gate_up) + b(out)});
  impl_swiglu_forward(gate_up, out);
}

void Backend::swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up) {
  require_same_shape(gate_up, dgate_up, "swiglu_backward");
  MXTRAIN_ASSERT(gate_up.cols() == 2 * dout.cols() && gate_up.rows() == dout.rows(), "swiglu_backward: shapes");
  record({OpKind::swiglu_backward, phase_, dout.dtype, 12 * n(dout), b(dout) + b(gate_up) + b(dgate_up)});
  impl_swiglu_backward(dout, gate_up, dgate_up);
}

void Backend::gelu_forward(const Tensor& x, const Tensor& out) {
  require_same_shape(x, out, "gelu_forward");
  record({OpKind::gelu_forward, phase_, x.dtype, 10 * n(x), b(x) + b(out)});
  impl_gelu_forward(x, out);
}

void Backend::gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx) {
  require_same_shape(dout, x, "gelu_backward");
  require_same_shape(dout, dx, "gelu_backward");
  record({OpKind::gelu_backward, phase_, x.dtype, 20 * n(x), b(dout) + b(x) + b(dx)});
  impl_gelu_backward(dout, x, dx);
}

void Backend::add(const Tensor& a, const Tensor& bb, const Tensor& out) {
  require_same_shape(a, bb, "add");
  require_same_shape(a, out, "add");
  record({OpKind::add, phase_, a.dtype, n(a), b(a) + b(bb) + b(out)});
  impl_add(a, bb, out);
}

void Backend::cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses, int64_t valid_vocab,
                            float grad_scale) {
  MXTRAIN_ASSERT(logits.rank() == 2 && targets.numel() == logits.rows() && losses.numel() == logits.rows() &&
                     targets.dtype == DType::i32 && losses.dtype == DType::f32,
                 "cross_entropy: logits %s, targets %s, losses %s", logits.describe().c_str(),
                 targets.describe().c_str(), losses.describe().c_str());
  MXTRAIN_ASSERT(valid_vocab > 0 && valid_vocab <= logits.cols(), "cross_entropy: valid_vocab");
  record({OpKind::cross_entropy, phase_, logits.dtype, 5 * n(logits),
          b(logits) * (grad_scale != 0 ? 2 : 1) + b(targets) + b(losses)});
  impl_cross_entropy(logits, targets, losses, valid_vocab, grad_scale);
}

void Backend::sum(const Tensor& x, const Tensor& out, bool accumulate) {
  MXTRAIN_ASSERT(out.dtype == DType::f32 && out.numel() >= 1, "sum: out must be f32");
  record({OpKind::sum, phase_, x.dtype, n(x), b(x) + 4});
  impl_sum(x, out, accumulate, false);
}

void Backend::sum_of_squares(const Tensor& x, const Tensor& out, bool accumulate) {
  MXTRAIN_ASSERT(out.dtype == DType::f32 && out.numel() >= 1, "sum_of_squares: out must be f32");
  record({OpKind::sum_of_squares, phase_, x.dtype, 2 * n(x), b(x) + 4});
  impl_sum(x, out, accumulate, true);
}

void Backend::scale(const Tensor& x, float factor) {
  require_contiguous(x, "scale");
  record({OpKind::scale, phase_, x.dtype, n(x), 2 * b(x)});
  impl_scale(x, factor);
}

void Backend::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const Tensor& compute_copy, const Tensor& grad_norm_sq, const AdamWArgs& args) {
  MXTRAIN_ASSERT(param.dtype == DType::f32 && m.dtype == DType::f32 && v.dtype == DType::f32,
                 "adamw: master, m and v must be f32");
  MXTRAIN_ASSERT(grad.numel() == param.numel() && m.numel() == param.numel() && v.numel() == param.numel(),
                 "adamw: sizes differ");
  MXTRAIN_ASSERT(!compute_copy.defined() || compute_copy.numel() == param.numel(), "adamw: compute copy size");
  MXTRAIN_ASSERT(args.max_grad_norm <= 0 || grad_norm_sq.defined(), "adamw: clipping needs grad_norm_sq");
  MXTRAIN_ASSERT(args.decay_count >= 0 && args.decay_count <= param.numel(), "adamw: decay_count");
  record({OpKind::adamw, phase_, grad.dtype, 16 * n(param),
          2 * b(param) + b(grad) + 2 * b(m) + 2 * b(v) + b(compute_copy)});
  impl_adamw(param, grad, m, v, compute_copy, grad_norm_sq, args);
}

}  // namespace mxtrain
