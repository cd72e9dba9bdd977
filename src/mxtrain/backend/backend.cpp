// The non-virtual half of Backend: argument checks and the one table of FLOP and byte
// formulas that every backend reports through its TraceObserver.
#include "mxtrain/backend/backend.hpp"

#include <tuple>

#include <chrono>
#include <cmath>

#include "mxtrain/backend/private_buffers.hpp"
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

Buffer Backend::allocate(const std::string& name, Shape shape, DType dtype, Lifetime lifetime, const void* at) {
  size_t bytes = dtype_bytes(dtype, static_cast<size_t>(shape.numel()));
  CachingAllocator::Allocation allocation = allocator_->allocate(bytes, name, lifetime, at);
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
  // Writes out, reads a row of each table per row of out (the tables may be wider: FP32 masters).
  const double table_bytes = static_cast<double>(dtype_bytes(token_table.dtype, static_cast<size_t>(out.numel())));
  double row_bytes = b(out) + table_bytes * (position_table.defined() ? 2.0 : 1.0);
  record({OpKind::embedding_forward, phase_, out.dtype, n(out) * (position_table.defined() ? 1 : 0),
          b(tokens) + row_bytes});
  impl_embedding_forward(tokens, token_table, position_table, out, seq_len);
}

void Backend::embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                                 const Tensor& dposition_table, int64_t seq_len) {
  MXTRAIN_ASSERT(tokens.dtype == DType::i32 && tokens.numel() == dout.rows() && dout.cols() == dtoken_table.cols(),
                 "embedding_backward: tokens %s, dout %s, dtable %s", tokens.describe().c_str(),
                 dout.describe().c_str(), dtoken_table.describe().c_str());
  MXTRAIN_ASSERT(seq_len > 0 && dout.rows() % seq_len == 0, "embedding_backward: rows %% seq_len");
  double grad_row_bytes = static_cast<double>(dtype_bytes(dtoken_table.dtype, static_cast<size_t>(dout.numel())));
  double per_table = 2 * grad_row_bytes;
  record({OpKind::embedding_backward, phase_, dout.dtype, n(dout) * (dposition_table.defined() ? 2 : 1),
          b(tokens) + b(dout) + per_table * (dposition_table.defined() ? 2 : 1)});
  impl_embedding_backward(tokens, dout, dtoken_table, dposition_table, seq_len);
}

static double norm_flops(NormKind kind, double elements) { return (kind == NormKind::rms ? 4.0 : 7.0) * elements; }

void Backend::norm_forward(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias,
                           const Tensor& out, const Tensor& mean, const Tensor& rstd, float eps,
                           const Tensor& out_amax) {
  if (out.defined()) require_same_shape(x, out, "norm_forward");
  MXTRAIN_ASSERT(out.defined() || !out_amax.defined(), "norm_forward: an output amax needs the output");
  MXTRAIN_ASSERT(weight.numel() == x.cols() && rstd.numel() == x.rows(), "norm_forward: weight/rstd shape");
  MXTRAIN_ASSERT(kind == NormKind::rms || (mean.numel() == x.rows() && bias.numel() == x.cols()),
                 "layer norm needs mean and bias");
  record({OpKind::norm_forward, phase_, x.dtype, norm_flops(kind, n(x)),
          b(x) + b(out) + b(weight) + b(bias) + b(mean) + b(rstd)});
  impl_norm_forward(kind, x, weight, bias, out, mean, rstd, eps, kernel_amax(out_amax));
  finish_amax(out, out_amax);
}

Tensor Backend::kernel_amax(const Tensor& out_amax) const {
  MXTRAIN_ASSERT(!out_amax.defined() || (out_amax.dtype == DType::f32 && out_amax.numel() == 1),
                 "an output amax is f32 [1], got %s", out_amax.describe().c_str());
  return records_output_amax() ? out_amax : Tensor();
}

void Backend::finish_amax(const Tensor& out, const Tensor& out_amax) {
  if (out_amax.defined() && !records_output_amax()) impl_amax(out, out_amax, false, false);
}

void Backend::add_norm_forward(NormKind kind, const Tensor& a, const Tensor& bb, const Tensor& sum,
                               const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& mean,
                               const Tensor& rstd, float eps, const Tensor& out_amax) {
  require_same_shape(a, bb, "add_norm_forward");
  require_same_shape(a, sum, "add_norm_forward");
  if (out.defined()) require_same_shape(a, out, "add_norm_forward");
  MXTRAIN_ASSERT(out.defined() || !out_amax.defined(), "add_norm_forward: an output amax needs the output");
  MXTRAIN_ASSERT(weight.numel() == a.cols() && rstd.numel() == a.rows(), "add_norm_forward: weight/rstd shape");
  MXTRAIN_ASSERT(kind == NormKind::rms || (mean.numel() == a.rows() && bias.numel() == a.cols()),
                 "layer norm needs mean and bias");
  record({OpKind::add_norm_forward, phase_, a.dtype, norm_flops(kind, n(a)) + n(a),
          b(a) + b(bb) + b(sum) + b(out) + b(weight) + b(bias) + b(mean) + b(rstd)});
  impl_add_norm_forward(kind, a, bb, sum, weight, bias, out, mean, rstd, eps, kernel_amax(out_amax));
  finish_amax(out, out_amax);
}

void Backend::impl_add_norm_forward(NormKind kind, const Tensor& a, const Tensor& bb, const Tensor& sum,
                                    const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& mean,
                                    const Tensor& rstd, float eps, const Tensor& out_amax) {
  impl_add(a, bb, sum);
  impl_norm_forward(kind, sum, weight, bias, out, mean, rstd, eps, out_amax);
}

void Backend::norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                            const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                            const Tensor& dbias, bool accumulate_dx, bool accumulate_dparams,
                            const Tensor& dx_amax, const DxColumnSums& dx_sums) {
  require_same_shape(dout, x, "norm_backward");
  require_same_shape(dout, dx, "norm_backward");
  MXTRAIN_ASSERT(dweight.numel() == x.cols(), "norm_backward: dweight shape");
  for (const Tensor* sums : {&dx_sums.in, &dx_sums.out})
    MXTRAIN_ASSERT(!sums->defined() || sums->numel() == x.cols(), "norm_backward: dx column sums %s for %lld columns",
                   sums->describe().c_str(), static_cast<long long>(x.cols()));
  MXTRAIN_ASSERT(!dx_sums.in.defined() || accumulate_dx, "norm_backward: the incoming dx's column sums need accumulate_dx");
  // The column sums add an addition an element each and their own small outputs; dx is read and
  // written by the norm's pass either way.
  const double sums = (dx_sums.in.defined() ? 1.0 : 0.0) + (dx_sums.out.defined() ? 1.0 : 0.0);
  record({OpKind::norm_backward, phase_, x.dtype, 2 * norm_flops(kind, n(x)) + sums * n(x),
          b(dout) + b(x) + b(dx) * (accumulate_dx ? 2 : 1) + b(weight) +
              (b(dweight) + b(dbias)) * (accumulate_dparams ? 2 : 1) + b(mean) + b(rstd) +
              b(dx_sums.in) * (dx_sums.accumulate_in ? 2 : 1) + b(dx_sums.out) * (dx_sums.accumulate_out ? 2 : 1)});
  impl_norm_backward(kind, dout, x, weight, mean, rstd, dx, dweight, dbias, accumulate_dx, accumulate_dparams,
                     kernel_amax(dx_amax), dx_sums);
  finish_amax(dx, dx_amax);
}

const char* gemm_epilogue_name(GemmEpilogue epilogue) {
  switch (epilogue) {
    case GemmEpilogue::none: return "none";
    case GemmEpilogue::gelu_aux_bias: return "gelu_aux_bias";
    case GemmEpilogue::swiglu_aux: return "swiglu_aux";
    case GemmEpilogue::dgelu: return "dgelu";
  }
  return "?";
}

namespace {

OpKind gemm_op_kind(GemmRole role) {
  static constexpr OpKind kinds[] = {OpKind::linear_forward, OpKind::linear_backward_input,
                                     OpKind::linear_backward_weight};
  return kinds[static_cast<int>(role)];
}

}  // namespace

void Backend::gemm(const GemmArgs& args) {
  MXTRAIN_ASSERT(args.a.is_quantized() == args.b.is_quantized(), "gemm: operand a is %s, b is %s",
                 args.a.is_quantized() ? "quantized" : "high precision",
                 args.b.is_quantized() ? "quantized" : "high precision");
  MXTRAIN_ASSERT(!args.bias.defined() || args.role == GemmRole::forward, "gemm: a bias is the forward role's");
  MXTRAIN_ASSERT(!args.residual.defined() || args.role == GemmRole::forward, "gemm: a residual is the forward role's");
  MXTRAIN_ASSERT(!args.bias_gradient.defined() || args.role == GemmRole::backward_weight ||
                     args.epilogue == GemmEpilogue::dgelu,
                 "gemm: a bias gradient is the backward_weight role's, or the dgelu epilogue's");
  MXTRAIN_ASSERT(!args.bias_gradient_accumulate ||
                     (args.epilogue == GemmEpilogue::dgelu && args.bias_gradient.defined()),
                 "gemm: bias_gradient_accumulate is for the dgelu epilogue's bias gradient");
  MXTRAIN_ASSERT(args.epilogue != GemmEpilogue::gelu_aux_bias || args.role == GemmRole::forward,
                 "gemm: gelu_aux_bias is the forward role's");
  MXTRAIN_ASSERT(args.epilogue != GemmEpilogue::swiglu_aux || (args.role == GemmRole::forward && !args.bias.defined()),
                 "gemm: swiglu_aux is the forward role's, without a bias");
  MXTRAIN_ASSERT(args.epilogue != GemmEpilogue::dgelu || args.role == GemmRole::backward_input,
                 "gemm: dgelu is the backward_input role's");
  MXTRAIN_ASSERT(args.epilogue == GemmEpilogue::none ? !args.aux.defined() : args.aux.defined(),
                 "gemm: the %s epilogue %s an aux tensor", gemm_epilogue_name(args.epilogue),
                 args.epilogue == GemmEpilogue::none ? "takes no" : "needs");
  MXTRAIN_ASSERT(args.epilogue == GemmEpilogue::none || (!args.accumulate && !args.residual.defined()),
                 "gemm: the %s epilogue overwrites its output", gemm_epilogue_name(args.epilogue));
  if (args.a.is_quantized()) {
    check_and_record_quantized_gemm(args);
  } else if (args.epilogue == GemmEpilogue::dgelu && args.bias_gradient.defined() &&
             !gemm_fuses_dgelu_bias_gradient(args.out.dtype, args.a.tensor.cols(), args.out.cols())) {
    // The GEMM, then the bias gradient's column sum over its output.
    GemmArgs product = args;
    product.bias_gradient = Tensor();
    product.bias_gradient_accumulate = false;
    gemm(product);
    column_sum(args.out, args.bias_gradient, args.bias_gradient_accumulate);
    return;
  } else {
    check_and_record_gemm(args);
  }
  impl_gemm(args);
}

void Backend::check_and_record_gemm(const GemmArgs& args) {
  const Tensor &a = args.a.tensor, &bt = args.b.tensor, &out = args.out;
  MXTRAIN_ASSERT(a.defined() && bt.defined() && out.defined(), "gemm: a %s, b %s, out %s", a.describe().c_str(),
                 bt.describe().c_str(), out.describe().c_str());
  OpRecord op{gemm_op_kind(args.role), phase_, a.dtype};
  switch (args.role) {
    case GemmRole::forward: {
      // out[N,M] = x[N,K] · weight[M,K]ᵀ; with GELU the GEMM's own output is aux (pre).
      const Tensor &x = a, &weight = bt;
      const bool gelu = args.epilogue == GemmEpilogue::gelu_aux_bias;
      const bool swiglu = args.epilogue == GemmEpilogue::swiglu_aux;
      const Tensor& product = gelu || swiglu ? args.aux : out;
      MXTRAIN_ASSERT(weight.rank() == 2 && x.cols() == weight.size(1) && product.cols() == weight.size(0) &&
                         product.rows() == x.rows(),
                     "gemm forward: x %s, weight %s, out %s", x.describe().c_str(), weight.describe().c_str(),
                     product.describe().c_str());
      MXTRAIN_ASSERT(!args.bias.defined() || args.bias.numel() == weight.size(0), "gemm forward: bias shape");
      // FLOPs as the plain GEMM's (docs/benchmarking.md: matmuls and bias adds count); what the epilogue
      // reads or writes besides the operands and the product counts, as epilogue traffic.
      double extra_bytes = 0;
      if (gelu) {
        require_same_shape(args.aux, out, "gemm gelu_aux_bias");
        MXTRAIN_ASSERT(args.aux.dtype == out.dtype, "gemm gelu_aux_bias: aux %s, out %s", args.aux.describe().c_str(),
                       out.describe().c_str());
        extra_bytes = b(out);
      }
      if (swiglu) {
        MXTRAIN_ASSERT(out.rank() == 2 && out.rows() == args.aux.rows() && 2 * out.cols() == args.aux.cols() &&
                           args.aux.dtype == out.dtype,
                       "gemm swiglu_aux: aux %s, out %s (aux [N, 2F], out [N, F], one dtype)",
                       args.aux.describe().c_str(), out.describe().c_str());
        extra_bytes = b(out);
      }
      if (args.residual.defined()) {
        require_same_shape(args.residual, out, "gemm residual");
        MXTRAIN_ASSERT(args.residual.dtype == out.dtype, "gemm residual: residual %s, out %s",
                       args.residual.describe().c_str(), out.describe().c_str());
        extra_bytes = b(args.residual);
      }
      op.flops = 2.0 * n(product) * static_cast<double>(x.cols());
      op.bytes = b(x) + b(weight) + b(product) + b(args.bias) + extra_bytes;
      if (args.bias.defined()) op.flops += n(product);
      op.m = product.rows();
      op.n = product.cols();
      op.k = x.cols();
      op.epilogue_bytes = extra_bytes;
      MXTRAIN_ASSERT(!args.accumulate, "gemm forward: high-precision forward GEMMs overwrite (a residual adds)");
      break;
    }
    case GemmRole::backward_input: {
      // dx[N,K] (+)= dout[N,M] · weight[M,K]; with DGELU times gelu'(aux).
      const Tensor &dout = a, &weight = bt, &dx = out;
      MXTRAIN_ASSERT(weight.rank() == 2 && dout.cols() == weight.size(0) && dx.cols() == weight.size(1) &&
                         dx.rows() == dout.rows(),
                     "gemm backward_input: dout %s, weight %s, dx %s", dout.describe().c_str(),
                     weight.describe().c_str(), dx.describe().c_str());
      op.flops = 2.0 * n(dx) * static_cast<double>(dout.cols());
      if (args.epilogue == GemmEpilogue::dgelu) {
        require_same_shape(args.aux, dx, "gemm dgelu");
        MXTRAIN_ASSERT(args.aux.dtype == dx.dtype, "gemm dgelu: aux %s, dx %s", args.aux.describe().c_str(),
                       dx.describe().c_str());
        op.bytes = b(dout) + b(weight) + b(dx) + b(args.aux);
        op.epilogue_bytes = b(args.aux);
        if (args.bias_gradient.defined()) {  // summed inside the GEMM (gemm_fuses_dgelu_bias_gradient)
          MXTRAIN_ASSERT(args.bias_gradient.numel() == dx.cols(), "gemm dgelu: bias gradient %s for dx %s",
                         args.bias_gradient.describe().c_str(), dx.describe().c_str());
          op.flops += n(dx);
          op.bytes += b(args.bias_gradient) * (args.bias_gradient_accumulate ? 2 : 1);
        }
      } else {
        op.bytes = b(dout) + b(weight) + b(dx) * (args.accumulate ? 2 : 1);
      }
      op.m = dx.rows();
      op.n = dx.cols();
      op.k = dout.cols();
      break;
    }
    case GemmRole::backward_weight: {
      // dweight[M,K] (+)= dout[N,M]ᵀ · x[N,K]; dbias[M] (+)= column sums of dout.
      const Tensor &dout = a, &x = bt, &dweight = out, &dbias = args.bias_gradient;
      MXTRAIN_ASSERT(dweight.rank() == 2 && dout.cols() == dweight.size(0) && x.cols() == dweight.size(1) &&
                         x.rows() == dout.rows(),
                     "gemm backward_weight: dout %s, x %s, dweight %s", dout.describe().c_str(), x.describe().c_str(),
                     dweight.describe().c_str());
      MXTRAIN_ASSERT(!dbias.defined() || dbias.numel() == dout.cols(), "gemm backward_weight: dbias %s",
                     dbias.describe().c_str());
      op.flops = 2.0 * n(dweight) * static_cast<double>(x.rows());
      op.bytes = b(dout) + b(x) + (b(dweight) + b(dbias)) * (args.accumulate ? 2 : 1);
      if (dbias.defined()) op.flops += n(dout);
      op.m = dweight.size(0);
      op.n = dweight.size(1);
      op.k = x.rows();
      break;
    }
  }
  record(op);
}

void Backend::gemm_epilogue_apart(const GemmArgs& args) {
  MXTRAIN_ASSERT((!args.a.is_quantized() || args.epilogue == GemmEpilogue::none) && has_separable_epilogue(args),
                 "gemm_epilogue_apart: no epilogue to run apart");
  GemmArgs plain = args;
  plain.epilogue = GemmEpilogue::none;
  plain.aux = Tensor();
  plain.residual = Tensor();
  switch (args.epilogue) {
    case GemmEpilogue::none:  // the residual: the GEMM, then the add in place on the output
      impl_gemm(plain);
      impl_add(args.out, args.residual, args.out);
      return;
    case GemmEpilogue::gelu_aux_bias:
      plain.out = args.aux;
      impl_gemm(plain);
      impl_gelu_forward(args.aux, args.out, Tensor());
      return;
    case GemmEpilogue::swiglu_aux:
      plain.out = args.aux;
      impl_gemm(plain);
      impl_swiglu_forward(args.aux, args.out, Tensor());
      return;
    case GemmEpilogue::dgelu: {
      Buffer product = allocate("linear.gelu_input_grad", args.out.shape, args.out.dtype, Lifetime::scratch);
      plain.out = product;
      plain.accumulate = false;
      plain.bias_gradient = Tensor();  // the caller's, after this
      plain.bias_gradient_accumulate = false;
      impl_gemm(plain);
      impl_gelu_backward(product, args.aux, args.out, Tensor());
      return;
    }
  }
}

static void check_attention_shape(const AttentionShape& shape, const Tensor& qkv, const char* op) {
  MXTRAIN_ASSERT(shape.heads > 0 && shape.kv_heads > 0 && shape.heads % shape.kv_heads == 0,
                 "%s: heads %lld not a multiple of kv_heads %lld", op, static_cast<long long>(shape.heads),
                 static_cast<long long>(shape.kv_heads));
  MXTRAIN_ASSERT(qkv.rows() == shape.batch * shape.seq && qkv.cols() == shape.qkv_cols(), "%s: qkv %s", op,
                 qkv.describe().c_str());
}

bool RopeSpec::operator<(const RopeSpec& other) const {
  return std::tie(theta, scaling_factor, low_freq_factor, high_freq_factor, original_max_positions) <
         std::tie(other.theta, other.scaling_factor, other.low_freq_factor, other.high_freq_factor,
                  other.original_max_positions);
}

std::vector<float> rope_inverse_frequencies(int64_t head_dim, const RopeSpec& spec) {
  MXTRAIN_ASSERT(head_dim % 2 == 0 && spec.theta > 0, "rope: head_dim %lld, theta %g", static_cast<long long>(head_dim),
                 static_cast<double>(spec.theta));
  std::vector<float> inv_freq(static_cast<size_t>(head_dim / 2));
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv_freq[i] = 1.0f / std::pow(spec.theta, exponent);
  }
  if (!spec.scaled()) return inv_freq;
  // transformers' _compute_llama3_parameters, in f32 as there.
  const float old_context = static_cast<float>(spec.original_max_positions);
  const float low_freq_wavelen = old_context / spec.low_freq_factor;
  const float high_freq_wavelen = old_context / spec.high_freq_factor;
  for (float& frequency : inv_freq) {
    const float wavelen = static_cast<float>(2.0 * M_PI) / frequency;
    const float scaled = wavelen > low_freq_wavelen ? frequency / spec.scaling_factor : frequency;
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    if (medium) {
      const float smooth = (old_context / wavelen - spec.low_freq_factor) / (spec.high_freq_factor - spec.low_freq_factor);
      frequency = (1.0f - smooth) * scaled / spec.scaling_factor + smooth * scaled;
    } else {
      frequency = scaled;
    }
  }
  return inv_freq;
}

void Backend::rope_forward(const Tensor& qkv, const AttentionShape& shape, const RopeSpec& rope) {
  check_attention_shape(shape, qkv, "rope_forward");
  double rotated = static_cast<double>(qkv.rows() * (shape.heads + shape.kv_heads) * shape.head_dim);
  record({OpKind::rope_forward, phase_, qkv.dtype, 3 * rotated,
          2 * rotated * dtype_bits(qkv.dtype) / 8.0});
  impl_rope(qkv, shape, rope, false, Tensor());
}

void Backend::rope_backward(const Tensor& dqkv, const AttentionShape& shape, const RopeSpec& rope,
                            const Tensor& out_amax) {
  check_attention_shape(shape, dqkv, "rope_backward");
  double rotated = static_cast<double>(dqkv.rows() * (shape.heads + shape.kv_heads) * shape.head_dim);
  // The amax also reads the v heads.
  const double v_bytes = out_amax.defined() ? static_cast<double>(dqkv.rows() * shape.kv_heads * shape.head_dim) *
                                                  dtype_bits(dqkv.dtype) / 8.0
                                            : 0.0;
  record({OpKind::rope_backward, phase_, dqkv.dtype, 3 * rotated,
          2 * rotated * dtype_bits(dqkv.dtype) / 8.0 + v_bytes});
  impl_rope(dqkv, shape, rope, true, kernel_amax(out_amax));
  finish_amax(dqkv, out_amax);
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

void Backend::attention_cached(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                               const AttentionShape& shape) {
  check_attention_shape(shape, qkv, "attention_cached");
  const int64_t kv_cols = shape.kv_heads * shape.head_dim, past = shape.position_offset;
  MXTRAIN_ASSERT(shape.batch == 1, "attention_cached: batch %lld (the cache holds one sequence)",
                 static_cast<long long>(shape.batch));
  MXTRAIN_ASSERT(k_cache.rank() == 2 && k_cache.cols() == kv_cols && k_cache.dtype == qkv.dtype &&
                     k_cache.is_contiguous(),
                 "attention_cached: k_cache %s for qkv %s", k_cache.describe().c_str(), qkv.describe().c_str());
  require_same_shape(k_cache, v_cache, "attention_cached");
  MXTRAIN_ASSERT(v_cache.dtype == qkv.dtype && v_cache.is_contiguous(), "attention_cached: v_cache %s",
                 v_cache.describe().c_str());
  MXTRAIN_ASSERT(past >= 0 && past + shape.seq <= k_cache.rows(),
                 "attention_cached: positions [%lld, %lld) past the cache's %lld rows", static_cast<long long>(past),
                 static_cast<long long>(past + shape.seq), static_cast<long long>(k_cache.rows()));
  MXTRAIN_ASSERT(out.rows() == qkv.rows() && out.cols() == shape.heads * shape.head_dim && out.dtype == qkv.dtype,
                 "attention_cached: out %s", out.describe().c_str());
  // Row i scores past + i + 1 keys: QKᵀ and PV, 2 flops per multiply-add each.
  const double keys = static_cast<double>(shape.seq) * static_cast<double>(past) +
                      static_cast<double>(shape.seq) * static_cast<double>(shape.seq + 1) / 2.0;
  const double element = dtype_bits(qkv.dtype) / 8.0;
  const double cache_rows_read = static_cast<double>(past + shape.seq);
  OpRecord op{OpKind::attention_cached, phase_, qkv.dtype,
              4.0 * keys * static_cast<double>(shape.heads * shape.head_dim),
              b(qkv) + b(out) + (2 * cache_rows_read + 2 * static_cast<double>(shape.seq)) *
                                    static_cast<double>(kv_cols) * element};
  op.m = shape.heads;
  op.n = past + shape.seq;
  op.k = shape.head_dim;
  record(op);
  impl_attention_cached(qkv, k_cache, v_cache, out, shape);
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

void Backend::swiglu_forward(const Tensor& gate_up, const Tensor& out, const Tensor& out_amax) {
  MXTRAIN_ASSERT(gate_up.rows() == out.rows() && gate_up.cols() == 2 * out.cols(), "swiglu_forward: %s -> %s",
                 gate_up.describe().c_str(), out.describe().c_str());
  record({OpKind::swiglu_forward, phase_, out.dtype, 6 * n(out), b(gate_up) + b(out)});
  impl_swiglu_forward(gate_up, out, kernel_amax(out_amax));
  finish_amax(out, out_amax);
}

void Backend::swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up,
                              const Tensor& out_amax) {
  require_same_shape(gate_up, dgate_up, "swiglu_backward");
  MXTRAIN_ASSERT(gate_up.cols() == 2 * dout.cols() && gate_up.rows() == dout.rows(), "swiglu_backward: shapes");
  record({OpKind::swiglu_backward, phase_, dout.dtype, 12 * n(dout), b(dout) + b(gate_up) + b(dgate_up)});
  impl_swiglu_backward(dout, gate_up, dgate_up, kernel_amax(out_amax));
  finish_amax(dgate_up, out_amax);
}

void Backend::gelu_forward(const Tensor& x, const Tensor& out, const Tensor& out_amax) {
  require_same_shape(x, out, "gelu_forward");
  record({OpKind::gelu_forward, phase_, x.dtype, 10 * n(x), b(x) + b(out)});
  impl_gelu_forward(x, out, kernel_amax(out_amax));
  finish_amax(out, out_amax);
}

void Backend::gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, const Tensor& out_amax) {
  require_same_shape(dout, x, "gelu_backward");
  require_same_shape(dout, dx, "gelu_backward");
  record({OpKind::gelu_backward, phase_, x.dtype, 20 * n(x), b(dout) + b(x) + b(dx)});
  impl_gelu_backward(dout, x, dx, kernel_amax(out_amax));
  finish_amax(dx, out_amax);
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

void Backend::head_loss(const HeadLossChunk& c) {
  const bool training = c.dx.defined();
  MXTRAIN_ASSERT(!training || c.dweight.defined(), "head_loss: dx without dweight");
  const GemmArgs forward{.role = GemmRole::forward, .a = c.x, .b = c.weight, .out = c.logits};
  const GemmArgs weight_grad{
      .role = GemmRole::backward_weight, .a = c.logits, .b = c.x, .out = c.dweight, .accumulate = c.accumulate};
  const GemmArgs input_grad{.role = GemmRole::backward_input, .a = c.logits, .b = c.weight, .out = c.dx};
  if (!training || !fuses_head_loss(c)) {
    gemm(forward);
    cross_entropy(c.logits, c.targets, c.losses, c.valid_vocab, training ? c.grad_scale : 0.0f);
    if (training) {
      PhaseScope scope(*this, Phase::backward);
      gemm(weight_grad);
      gemm(input_grad);
    }
    return;
  }
  MXTRAIN_ASSERT(c.valid_vocab > 0 && c.valid_vocab <= c.logits.cols() && c.targets.dtype == DType::i32 &&
                     c.losses.dtype == DType::f32 && c.targets.numel() == c.x.rows() && c.losses.numel() == c.x.rows(),
                 "head_loss: targets %s, losses %s", c.targets.describe().c_str(), c.losses.describe().c_str());
  // The same three GEMMs as apart, and the glue between them (the offsets' and sums' partials in,
  // the strip, the scaled rows and the row scalars out) as the cross-entropy op.
  check_and_record_gemm(forward);
  const private_buffers::HeadLossPlan plan = private_buffers::head_loss(c);
  record({OpKind::cross_entropy, phase_, c.logits.dtype, plan.glue_flops, plan.glue_bytes});
  PhaseScope scope(*this, Phase::backward);
  check_and_record_gemm(weight_grad);
  check_and_record_gemm(input_grad);
  impl_head_loss_fused(c);
}

void Backend::impl_head_loss_fused(const HeadLossChunk&) {
  throw Error(ErrorKind::internal, std::string(name()) + " backend: head_loss fused where it fuses none", "");
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

// ---- precision recipes ----------------------------------------------------------------------

const char* scaling_mode_name(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::per_tensor: return "per-tensor";
    case ScalingMode::mxfp8: return "mxfp8";
    case ScalingMode::nvfp4: return "nvfp4";
  }
  return "?";
}

int64_t scaling_block_size(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::per_tensor: return 1;
    case ScalingMode::mxfp8: return 32;
    case ScalingMode::nvfp4: return 16;
  }
  return 1;
}

DType block_scale_dtype(ScalingMode mode) {
  switch (mode) {
    case ScalingMode::per_tensor: return DType::f32;
    case ScalingMode::mxfp8: return DType::e8m0;
    case ScalingMode::nvfp4: return DType::e4m3;
  }
  return DType::f32;
}

Shape block_scale_shape(const QuantizeSpec& spec, int64_t rows, int64_t k) {
  if (spec.mode == ScalingMode::per_tensor) return Shape{1};
  const int64_t blocks = k / scaling_block_size(spec.mode);
  if (!spec.swizzled_scales) return Shape{rows, blocks};
  // numerics/scale_layout.hpp: rows padded to 128, blocks to 4.
  return Shape{(rows + 127) / 128 * 128 * ((blocks + 3) / 4 * 4)};
}

namespace {

void check_quantized(const QuantizedTensor& q, const char* op) {
  const QuantizeSpec& spec = q.spec;
  MXTRAIN_ASSERT(q.data.rank() == 2 && q.data.is_contiguous(), "%s: data %s must be a contiguous matrix", op,
                 q.data.describe().c_str());
  MXTRAIN_ASSERT(q.data.dtype == spec.element, "%s: data %s, spec element %s", op, q.data.describe().c_str(),
                 std::string(dtype_name(spec.element)).c_str());
  const bool fp8 = spec.element == DType::e4m3 || spec.element == DType::e5m2;
  MXTRAIN_ASSERT(spec.mode == ScalingMode::nvfp4 ? spec.element == DType::e2m1 : fp8, "%s: %s elements in %s scaling",
                 op, std::string(dtype_name(spec.element)).c_str(), scaling_mode_name(spec.mode));
  MXTRAIN_ASSERT(q.k() % scaling_block_size(spec.mode) == 0, "%s: K = %lld is not a multiple of the %s block", op,
                 static_cast<long long>(q.k()), scaling_mode_name(spec.mode));
  MXTRAIN_ASSERT(!spec.nvfp4_tiles || q.rows() % 16 == 0, "%s: 16x16 tiles need rows %% 16, got %lld", op,
                 static_cast<long long>(q.rows()));
  MXTRAIN_ASSERT(q.scale_inverse.dtype == block_scale_dtype(spec.mode) &&
                     q.scale_inverse.shape.numel() == block_scale_shape(spec, q.rows(), q.k()).numel(),
                 "%s: scales %s for %s data %s", op, q.scale_inverse.describe().c_str(), scaling_mode_name(spec.mode),
                 q.data.describe().c_str());
  MXTRAIN_ASSERT(spec.mode != ScalingMode::nvfp4 || (q.amax.dtype == DType::f32 && q.amax.numel() >= 1),
                 "%s: nvfp4 needs its f32 amax", op);
}

double quantized_bytes(const QuantizedTensor& q) {
  return b(q.data) + b(q.scale_inverse) + (q.spec.mode == ScalingMode::nvfp4 ? 4.0 : 0.0);
}

}  // namespace

void Backend::amax(const Tensor& x, const Tensor& out, bool accumulate, bool hadamard_transposed) {
  require_contiguous(x, "amax");
  MXTRAIN_ASSERT(x.rank() >= 1 && out.dtype == DType::f32 && out.numel() >= 1, "amax: x %s, out %s",
                 x.describe().c_str(), out.describe().c_str());
  MXTRAIN_ASSERT(!hadamard_transposed || x.rows() % 16 == 0, "amax: the RHT of xᵀ needs rows %% 16, x %s",
                 x.describe().c_str());
  // The RHT: a scaling and 4 butterfly stages of 16-point chunks, 5 flops per element.
  record({OpKind::amax, phase_, x.dtype, n(x) * (hadamard_transposed ? 6 : 1), b(x) + 4});
  impl_amax(x, out, accumulate, hadamard_transposed);
}

// The format as supports() and OpRecord::format name it.
static DType format_key(const QuantizeSpec& spec) {
  switch (spec.mode) {
    case ScalingMode::per_tensor: return spec.element;
    case ScalingMode::mxfp8: return DType::e8m0;
    case ScalingMode::nvfp4: return DType::e2m1;
  }
  return spec.element;
}

void Backend::quantize(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                       const QuantizedTensor& columnwise, const Tensor& amax_out, const ScaleFromAmax& from,
                       const CastProducer& producer) {
  MXTRAIN_ASSERT(x.rank() == 2, "quantize: x %s must be a matrix", x.describe().c_str());
  if (!producer.defined()) require_contiguous(x, "quantize");
  MXTRAIN_ASSERT(rowwise.data.defined() || columnwise.data.defined(), "quantize: no copy requested");
  MXTRAIN_ASSERT(!from.defined() || (from.amax.dtype == DType::f32 && from.amax.numel() >= 1 &&
                                     from.args.rule == ScaleUpdateArgs::Rule::current),
                 "quantize: the scale comes from an f32 amax by the current rule");
  // A fused producer reads the op's inputs instead of x.
  double bytes = b(amax_out) * 2 + (from.defined() ? b(from.amax) + b(scale) : 0);
  double flops = 0;
  MXTRAIN_ASSERT(producer.op == CastProducer::Op::swiglu_backward || !producer.act_columnwise.data.defined(),
                 "quantize: only a swiglu_backward producer writes an activation copy");
  switch (producer.op) {
    case CastProducer::Op::none: bytes += b(x); break;
    case CastProducer::Op::swiglu_forward:
      require_contiguous(producer.gate_up, "quantize (swiglu_forward producer)");
      MXTRAIN_ASSERT(producer.gate_up.dtype == x.dtype && producer.gate_up.rows() == x.rows() &&
                         producer.gate_up.cols() == 2 * x.cols(),
                     "quantize: swiglu_forward of %s into x %s", producer.gate_up.describe().c_str(),
                     x.describe().c_str());
      bytes += b(producer.gate_up);
      flops += 6 * n(x);
      break;
    case CastProducer::Op::swiglu_backward:
      require_contiguous(producer.gate_up, "quantize (swiglu_backward producer)");
      require_contiguous(producer.dout, "quantize (swiglu_backward producer)");
      require_same_shape(producer.gate_up, x, "quantize (swiglu_backward producer)");
      MXTRAIN_ASSERT(producer.gate_up.dtype == x.dtype && producer.dout.dtype == x.dtype &&
                         producer.dout.rows() == x.rows() && 2 * producer.dout.cols() == x.cols(),
                     "quantize: swiglu_backward of %s and %s into x %s", producer.dout.describe().c_str(),
                     producer.gate_up.describe().c_str(), x.describe().c_str());
      bytes += b(producer.gate_up) + b(producer.dout);
      flops += 12 * n(producer.dout);
      if (producer.act_columnwise.data.defined()) {
        const QuantizedTensor& act = producer.act_columnwise;
        check_quantized(act, "quantize (swiglu_backward producer's activation copy)");
        MXTRAIN_ASSERT(act.spec.mode == ScalingMode::per_tensor && act.spec.element == DType::e4m3 && act.transposed &&
                           act.rows() == producer.dout.cols() && act.k() == x.rows() &&
                           producer.act_scale.dtype == DType::f32 && producer.act_scale.numel() >= 1 &&
                           (!producer.act_amax.defined() ||
                            (producer.act_amax.dtype == DType::f32 && producer.act_amax.numel() >= 1)),
                       "quantize: swiglu_backward's activation copy %s (scale %s, amax %s) for x %s: a per-tensor "
                       "E4M3 columnwise copy of [%lld, %lld]",
                       act.data.describe().c_str(), producer.act_scale.describe().c_str(),
                       producer.act_amax.describe().c_str(), x.describe().c_str(),
                       static_cast<long long>(x.rows()), static_cast<long long>(producer.dout.cols()));
        bytes += quantized_bytes(act) + b(producer.act_amax) * 2 + b(producer.act_scale);
        flops += 8 * n(producer.dout);
      }
      break;
    case CastProducer::Op::norm_forward: {
      const CastProducer& p = producer;
      require_contiguous(p.input, "quantize (norm_forward producer)");
      require_same_shape(p.input, x, "quantize (norm_forward producer)");
      const bool layer = p.norm == NormKind::layer;
      MXTRAIN_ASSERT(p.input.dtype == x.dtype && p.weight.numel() == x.cols() && p.rstd.numel() == x.rows() &&
                         p.rstd.dtype == DType::f32 && p.rstd.is_contiguous() &&
                         (!layer || (p.mean.numel() == x.rows() && p.mean.dtype == DType::f32 &&
                                     p.mean.is_contiguous())) &&
                         (!p.bias.defined() || (layer && p.bias.numel() == x.cols() && p.bias.dtype == p.weight.dtype)),
                     "quantize: %s norm_forward of %s (weight %s, bias %s, mean %s, rstd %s) into x %s",
                     layer ? "layer" : "rms", p.input.describe().c_str(), p.weight.describe().c_str(),
                     p.bias.describe().c_str(), p.mean.describe().c_str(), p.rstd.describe().c_str(),
                     x.describe().c_str());
      bytes += b(p.input) + b(p.weight) + b(p.bias) + b(p.mean) + b(p.rstd);
      flops += (layer ? 4 : 2) * n(x);
      break;
    }
    case CastProducer::Op::rope_backward:
      require_contiguous(producer.input, "quantize (rope_backward producer)");
      require_same_shape(producer.input, x, "quantize (rope_backward producer)");
      check_attention_shape(producer.shape, producer.input, "quantize (rope_backward producer)");
      MXTRAIN_ASSERT(producer.input.dtype == x.dtype, "quantize: rope_backward of %s into x %s",
                     producer.input.describe().c_str(), x.describe().c_str());
      bytes += b(producer.input);
      flops += 3.0 * static_cast<double>(x.rows() * (producer.shape.heads + producer.shape.kv_heads) *
                                         producer.shape.head_dim);
      break;
  }
  for (const QuantizedTensor* copy : {&rowwise, &columnwise}) {
    if (!copy->data.defined()) continue;
    check_quantized(*copy, "quantize");
    const bool transposed = copy == &columnwise;
    MXTRAIN_ASSERT(copy->transposed == transposed, "quantize: the %s copy has transposed = %d",
                   transposed ? "columnwise" : "rowwise", static_cast<int>(copy->transposed));
    MXTRAIN_ASSERT(copy->rows() == (transposed ? x.cols() : x.rows()) && copy->k() == (transposed ? x.rows() : x.cols()),
                   "quantize: x %s into %s copy %s", x.describe().c_str(), transposed ? "columnwise" : "rowwise",
                   copy->data.describe().c_str());
    if (copy->spec.mode == ScalingMode::per_tensor)
      MXTRAIN_ASSERT(scale.dtype == DType::f32 && scale.numel() >= 1, "quantize: per-tensor FP8 needs scale f32[1]");
    bytes += quantized_bytes(*copy);
    flops += n(x) * (copy->spec.mode == ScalingMode::per_tensor ? 2 : 3) + (copy->spec.hadamard ? 5 * n(x) : 0);
  }
  OpRecord op{OpKind::quantize, phase_, x.dtype, flops, bytes};
  op.format = format_key((rowwise.data.defined() ? rowwise : columnwise).spec);
  record(op);
  MXTRAIN_ASSERT(!from.defined() || (rowwise.data.defined() ? rowwise : columnwise).spec.mode == ScalingMode::per_tensor,
                 "quantize: a scale from an amax is per-tensor FP8's");
  if (producer.defined()) {
    MXTRAIN_ASSERT(!from.defined() && (rowwise.data.defined() ? rowwise : columnwise).spec.mode == ScalingMode::per_tensor,
                   "quantize: a fused producer needs per-tensor FP8 with a known scale");
    impl_quantize_produced(x, scale, rowwise, columnwise, amax_out, producer);
    return;
  }
  impl_quantize(x, scale, rowwise, columnwise, amax_out, from);
}

void Backend::dequantize(const QuantizedTensor& q, const Tensor& out) {
  check_quantized(q, "dequantize");
  require_contiguous(out, "dequantize");
  MXTRAIN_ASSERT(out.rank() == 2 && out.rows() == (q.transposed ? q.k() : q.rows()) &&
                     out.cols() == (q.transposed ? q.rows() : q.k()),
                 "dequantize: %s copy %s into %s", q.transposed ? "columnwise" : "rowwise", q.data.describe().c_str(),
                 out.describe().c_str());
  OpRecord op{OpKind::dequantize, phase_, out.dtype, n(out), quantized_bytes(q) + b(out)};
  op.format = format_key(q.spec);
  record(op);
  impl_dequantize(q, out);
}

void Backend::check_and_record_quantized_gemm(const GemmArgs& args) {
  const QuantizedTensor &a = args.a.quantized, &bq = args.b.quantized;
  const Tensor& out = args.out;
  check_quantized(a, "gemm");
  check_quantized(bq, "gemm");
  require_contiguous(out, "gemm");
  MXTRAIN_ASSERT(a.spec.mode == bq.spec.mode && a.k() == bq.k() && out.rank() == 2 && out.rows() == a.rows() &&
                     out.cols() == bq.rows(),
                 "gemm: quantized a %s, b %s, out %s", a.data.describe().c_str(), bq.data.describe().c_str(),
                 out.describe().c_str());
  MXTRAIN_ASSERT(!args.bias.defined() || args.bias.numel() == out.cols(), "gemm: bias shape");
  MXTRAIN_ASSERT(args.epilogue == GemmEpilogue::none && !args.bias_gradient.defined(),
                 "gemm: quantized operands take no epilogue but the bias and a forward's residual (the recipe "
                 "runs the rest apart)");
  if (args.residual.defined()) {
    MXTRAIN_ASSERT(args.role == GemmRole::forward && !args.accumulate, "gemm: a residual is a forward's");
    require_same_shape(args.residual, out, "gemm residual");
    MXTRAIN_ASSERT(args.residual.dtype == out.dtype, "gemm residual: residual %s, out %s",
                   args.residual.describe().c_str(), out.describe().c_str());
  }
  // The planner prices a quantized GEMM at its operands' rate: FP8 (per-tensor or MXFP8) or FP4.
  const DType rate = a.spec.mode == ScalingMode::nvfp4 ? DType::e2m1 : DType::e4m3;
  OpRecord op{gemm_op_kind(args.role), phase_, rate, 2.0 * n(out) * static_cast<double>(a.k()),
              quantized_bytes(a) + quantized_bytes(bq) + b(out) * (args.accumulate ? 2 : 1) + b(args.bias) +
                  b(args.residual)};
  op.epilogue_bytes = b(args.residual);
  if (args.bias.defined()) op.flops += n(out);
  op.m = out.rows();
  op.n = out.cols();
  op.k = a.k();
  record(op);
}

void Backend::fp8_scale_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inverse,
                               const ScaleUpdateArgs& args) {
  MXTRAIN_ASSERT(history.dtype == DType::f32 && scale.dtype == DType::f32 && scale_inverse.dtype == DType::f32,
                 "fp8_scale_update: f32 tensors");
  MXTRAIN_ASSERT(history.rank() == 2 && history.cols() == scale.numel() && scale.numel() == scale_inverse.numel(),
                 "fp8_scale_update: history %s, scale %s", history.describe().c_str(), scale.describe().c_str());
  MXTRAIN_ASSERT(args.rule == ScaleUpdateArgs::Rule::delayed || history.rows() == 1,
                 "fp8_scale_update: current scaling takes a history of length 1");
  const double rolled = args.rule == ScaleUpdateArgs::Rule::delayed ? 2 * b(history) : b(history);
  record({OpKind::scale_update, phase_, DType::f32, n(history) + 2 * n(scale), rolled + 3 * b(scale)});
  impl_fp8_scale_update(history, scale, scale_inverse, args);
}

void Backend::column_sum(const Tensor& x, const Tensor& out, bool accumulate) {
  (void)column_sum_row_stride(x);  // contiguous, or a 2-D view of whole rows' column ranges
  MXTRAIN_ASSERT(out.numel() == x.cols(), "column_sum: x %s, out %s", x.describe().c_str(), out.describe().c_str());
  record({OpKind::column_sum, phase_, x.dtype, n(x), b(x) + b(out) * (accumulate ? 2 : 1)});
  impl_column_sum(x, out, accumulate);
}

void Backend::qkv_bias_gradient(const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                                const Tensor& qkv_bias_grad, bool accumulate) {
  require_contiguous(dqkv, "qkv_bias_gradient");
  const int64_t hidden = out_bias_grad.numel();
  MXTRAIN_ASSERT(out_weight.rank() == 2 && out_weight.size(0) == hidden && out_weight.size(1) == hidden &&
                     dqkv.cols() == 3 * hidden && qkv_bias_grad.numel() == 3 * hidden && out_weight.is_contiguous() &&
                     out_bias_grad.is_contiguous() && qkv_bias_grad.is_contiguous(),
                 "qkv_bias_gradient: dqkv %s, out bias gradient %s, out weight %s, qkv bias gradient %s",
                 dqkv.describe().c_str(), out_bias_grad.describe().c_str(), out_weight.describe().c_str(),
                 qkv_bias_grad.describe().c_str());
  MXTRAIN_ASSERT(out_bias_grad.dtype == qkv_bias_grad.dtype,
                 "qkv_bias_gradient: out bias gradient %s and qkv bias gradient %s differ in dtype",
                 out_bias_grad.describe().c_str(), qkv_bias_grad.describe().c_str());
  // Reads dq (a third of dqkv's rows), Wo and the out bias gradient; writes the three parts.
  const double dq_bytes = b(dqkv) / 3, dq_values = n(dqkv) / 3;
  record({OpKind::qkv_bias_gradient, phase_, dqkv.dtype, dq_values + 2.0 * n(out_weight),
          dq_bytes + b(out_weight) + b(out_bias_grad) + b(qkv_bias_grad) * (accumulate ? 4.0 / 3.0 : 1.0)});
  impl_qkv_bias_gradient(dqkv, out_bias_grad, out_weight, qkv_bias_grad, accumulate);
}

int64_t column_sum_row_stride(const Tensor& x) {
  if (x.is_contiguous()) return x.cols();
  MXTRAIN_ASSERT(x.rank() == 2 && x.strides[1] == 1 && x.strides[0] >= x.cols(),
                 "column_sum: %s must be contiguous or a 2-D view of column ranges of whole rows",
                 x.describe().c_str());
  return x.strides[0];
}

AdamWStepFactors adamw_step_factors(const AdamWArgs& args) {
  const double lr = args.learning_rate, beta1 = args.beta1, beta2 = args.beta2;
  const double bias_correction1 = 1.0 - std::pow(beta1, static_cast<double>(args.step));
  const double bias_correction2 = 1.0 - std::pow(beta2, static_cast<double>(args.step));
  return AdamWStepFactors{static_cast<float>(1.0 - lr * static_cast<double>(args.weight_decay)),
                          static_cast<float>(-(lr / bias_correction1)),
                          static_cast<float>(std::sqrt(bias_correction2))};
}

void Backend::adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                    const Tensor& compute_copy, const Tensor& grad_norm_sq, const AdamWArgs& args) {
  const bool split = args.master_low.defined();
  const int64_t count = grad.numel();
  if (split) {
    MXTRAIN_ASSERT(!param.defined() && compute_copy.defined() && compute_copy.dtype == DType::bf16 &&
                       args.master_low.dtype == DType::u8 && args.master_low.numel() == 2 * count,
                   "adamw: a split master is a bf16 compute copy and u8 [2n] low halves, with no f32 param");
  } else {
    MXTRAIN_ASSERT(param.dtype == DType::f32 && param.numel() == count, "adamw: the master must be f32 [n]");
  }
  MXTRAIN_ASSERT(m.dtype == DType::f32 && v.dtype == DType::f32, "adamw: m and v must be f32");
  MXTRAIN_ASSERT(m.numel() == count && v.numel() == count, "adamw: sizes differ");
  MXTRAIN_ASSERT(!compute_copy.defined() || compute_copy.numel() == count, "adamw: compute copy size");
  MXTRAIN_ASSERT(args.max_grad_norm <= 0 || grad_norm_sq.defined(), "adamw: clipping needs grad_norm_sq");
  MXTRAIN_ASSERT(args.decay_count >= 0 && args.decay_count <= count, "adamw: decay_count");
  MXTRAIN_ASSERT(!args.step_factors.defined() ||
                     (args.step_factors.dtype == DType::f32 && args.step_factors.numel() == 3),
                 "adamw: step_factors must be f32 [3]");
  const bool norm_out = args.grad_norm_output != AdamWArgs::NormOutput::none;
  MXTRAIN_ASSERT(!norm_out || (args.max_grad_norm <= 0 && grad_norm_sq.defined() && grad_norm_sq.dtype == DType::f32),
                 "adamw: the squared gradient norm comes out of the update only without clipping, into an f32 tensor");
  // A split master reads and writes both halves; an f32 one reads and writes it, and writes the copy.
  const double master_bytes = split ? 2 * b(args.master_low) + 2 * b(compute_copy) : 2 * b(param) + b(compute_copy);
  // A weight cast writes a byte an element (its scale and amax are a few bytes).
  double cast_bytes = 0;
  for (const WeightCastSegment& segment : args.weight_casts) cast_bytes += b(segment.out.data);
  record({OpKind::adamw, phase_, grad.dtype, (norm_out ? 18 : 16) * n(grad),
          master_bytes + b(grad) + 2 * b(m) + 2 * b(v) + cast_bytes});
  const Tensor& written = compute_copy.defined() ? compute_copy : param;
  for (const AmaxSegment& segment : args.weight_amaxes)
    MXTRAIN_ASSERT(segment.begin >= 0 && segment.begin < segment.end && segment.end <= count &&
                       segment.amax.dtype == DType::f32 && segment.amax.numel() >= 1,
                   "adamw: amax segment [%lld, %lld) of %lld elements", static_cast<long long>(segment.begin),
                   static_cast<long long>(segment.end), static_cast<long long>(count));
  for (const WeightCastSegment& segment : args.weight_casts)
    MXTRAIN_ASSERT(segment.begin >= 0 && segment.begin < segment.end && segment.end <= count &&
                       segment.out.spec.mode == ScalingMode::per_tensor && segment.out.spec.element == DType::e4m3 &&
                       !segment.out.transposed && segment.out.data.numel() == segment.end - segment.begin &&
                       segment.scale.dtype == DType::f32 && segment.amax.dtype == DType::f32,
                   "adamw: weight cast [%lld, %lld) of %lld elements into %s", static_cast<long long>(segment.begin),
                   static_cast<long long>(segment.end), static_cast<long long>(count),
                   segment.out.data.describe().c_str());
  impl_adamw(param, grad, m, v, compute_copy, grad_norm_sq, args);
  // Part of the op, untraced (as finish_amax): the passes a fusing kernel spares.
  if (!casts_weights_in_adamw())
    for (const WeightCastSegment& segment : args.weight_casts)
      impl_quantize(written.slice_flat(segment.begin, segment.out.data.shape), segment.scale, segment.out,
                    QuantizedTensor{}, segment.amax, ScaleFromAmax{});
  if (records_output_amax()) return;
  for (const AmaxSegment& segment : args.weight_amaxes)
    impl_amax(written.slice_flat(segment.begin, Shape{segment.end - segment.begin}), segment.amax, true, false);
}

}  // namespace mxtrain
