// CudaBackend: construction (device, stream, library handles, fixed workspaces), the
// registry's two entry points, and the thin impl_ methods that route each op to its kernel
// launcher, cuBLASLt or cuDNN on the backend's stream.
#include "mxtrain/backend/cuda/cuda_backend.hpp"

#include <cmath>
#include <cstring>
#include <vector>

#include "mxtrain/backend/cuda/attention.hpp"
#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/backend/cuda/device_memory.hpp"
#include "mxtrain/backend/cuda/gemm.hpp"
#include "mxtrain/backend/cuda/kernels.hpp"
#include "mxtrain/backend/cuda/quack_gemm.hpp"
#include "mxtrain/backend/private_buffers.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"

namespace mxtrain {

namespace {

bool is_float(DType dtype) { return dtype == DType::f32 || dtype == DType::bf16 || dtype == DType::f16; }

}  // namespace

bool cuda_device_present() {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return count > 0;
}

int cuda_device_capability(int index) {
  int major = 0, minor = 0;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, index) != cudaSuccess ||
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, index) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return major * 10 + minor;
}

std::unique_ptr<Backend> create_cuda_backend(const BackendOptions& options) {
  int count = 0;
  cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) cudaGetLastError();
  if (status != cudaSuccess || count == 0) {
    throw Error(ErrorKind::unsupported,
                strf("no CUDA device is available (%s)",
                     status == cudaSuccess ? "the driver reports 0 devices" : cudaGetErrorString(status)),
                "run on a machine with an NVIDIA GPU and driver, or use --device cpu");
  }
  if (options.device_index < 0 || options.device_index >= count) {
    throw Error(ErrorKind::config, strf("CUDA device %d does not exist (%d visible)", options.device_index, count),
                "pick a device index below the visible count, or set CUDA_VISIBLE_DEVICES");
  }
  return std::make_unique<CudaBackend>(options);
}

CudaBackend::CudaBackend(const BackendOptions& options)
    : Backend(std::make_unique<CudaMemorySource>(options.device_index)), device_index_(options.device_index) {
  MXTRAIN_CUDA_CHECK(cudaSetDevice(device_index_));
  cudaDeviceProp props{};
  MXTRAIN_CUDA_CHECK(cudaGetDeviceProperties(&props, device_index_));
  properties_.name = props.name;
  properties_.memory_bytes = props.totalGlobalMem;
  properties_.compute_capability = props.major * 10 + props.minor;
  properties_.multiprocessors = props.multiProcessorCount;
  MXTRAIN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  for (cudaEvent_t& event : events_) MXTRAIN_CUDA_CHECK(cudaEventCreate(&event));

  std::vector<Buffer> workspaces = private_buffers::allocate_private(*this, private_buffers::backend_workspaces());
  gemm_workspace_ = std::move(workspaces[0]);
  reduction_partials_ = std::move(workspaces[1]);
  gemm_ = std::make_unique<CublasLtGemm>(gemm_workspace_.tensor().data, gemm_workspace_.tensor().bytes());
  gemm_->set_tf32(options.tf32);
  gemm_->set_autotune(options.gemm_autotune);
  gemm_->set_quack(options.gemm_quack);
  const bool any_quack = options.gemm_quack || options.gemm_quack_swiglu || options.gemm_quack_gelu;
  if (any_quack && quack_gemm::carried().empty())
    throw Error(ErrorKind::config,
                strf("train.gemm_kernels = %s needs quack's GEMMs, which this build does not carry",
                     options.gemm_quack          ? "cublaslt+quack"
                     : options.gemm_quack_gelu   ? "cublaslt+quack-gelu"
                                                 : "cublaslt+quack-swiglu"),
                "configure with -DMXTRAIN_FLASH_ATTENTION_4=<the folder scripts/fa4_kernels.sh makes> "
                "(docs/gemm-kernels.md), or set train.gemm_kernels = cublaslt");
  gemm_->set_quack_swiglu(options.gemm_quack_swiglu && quack_gemm::gated_carried());
  if (options.gemm_quack_swiglu && !quack_gemm::gated_carried())
    log::warn("train.gemm_kernels: this build's quack kernels have no gated (SwiGLU) GEMM (a kernel folder made "
              "before it was exported: rerun scripts/fa4_kernels.sh); SwiGLU runs as its own kernel");
  gemm_->set_quack_gelu(options.gemm_quack_gelu && quack_gemm::gelu_carried() && properties_.compute_capability == 90);
  if (options.gemm_quack_gelu && !quack_gemm::gelu_carried())
    log::warn("train.gemm_kernels: this build's quack kernels have no GELU GEMMs (a kernel folder made before they "
              "were exported: rerun scripts/fa4_kernels.sh); cuBLASLt's GELU epilogues run");
  if (options.head_loss_quack) {
    if (!quack_gemm::lce_carried())
      throw Error(ErrorKind::config, "train.head_loss = quack-lce needs quack's linear cross-entropy, which this build "
                                     "does not carry",
                  "configure with -DMXTRAIN_FLASH_ATTENTION_4=<the folder scripts/fa4_kernels.sh makes> (a folder "
                  "made before the linear cross-entropy was exported: rerun it), or set train.head_loss = chunked");
    if (properties_.compute_capability != 90)
      throw Error(ErrorKind::config,
                  strf("train.head_loss = quack-lce: quack's kernels are sm_90a code and this GPU is sm_%d",
                       properties_.compute_capability),
                  "set train.head_loss = chunked (or auto)");
    head_loss_quack_ = true;
  }
  if (any_quack && properties_.compute_capability != 90)
    log::info(strf("train.gemm_kernels: quack's kernels are sm_90a code; on this sm_%d GPU every GEMM is cuBLASLt's "
                   "and SwiGLU runs as its own kernel", properties_.compute_capability));
  attention_ = std::make_unique<CudnnAttention>(*this, &device_facts_);
  attention_->set_deterministic(options.deterministic);
  attention_->set_flash_attention_4_backward(options.flash_attention_4_backward);
}

CudaBackend::~CudaBackend() {
  // Nothing may still run on memory that is about to go back to the allocator.
  if (stream_) cudaStreamSynchronize(stream_);
  drop_capture();
  attention_.reset();
  gemm_.reset();
  rope_tables_.clear();
  reduction_partials_.reset();
  gemm_workspace_.reset();
  for (cudaEvent_t event : events_)
    if (event) cudaEventDestroy(event);
  if (stream_) cudaStreamDestroy(stream_);
  cudaGetLastError();
}

bool CudaBackend::supports(OpKind kind, DType dtype) const {
  if (is_float(dtype)) return true;
  const bool quantized = dtype == DType::e4m3 || dtype == DType::e5m2 || dtype == DType::e8m0 || dtype == DType::e2m1;
  switch (kind) {
    case OpKind::fill:
    case OpKind::copy:
    case OpKind::copy_from_host:
    case OpKind::copy_to_host: return dtype == DType::i32;
    case OpKind::amax:
    case OpKind::quantize:
    case OpKind::dequantize: return quantized;
    case OpKind::linear_forward:
    case OpKind::linear_backward_input:
    case OpKind::linear_backward_weight: {
      const int capability = properties_.compute_capability;
      if (dtype == DType::e4m3 || dtype == DType::e5m2) return capability >= 89;
#if CUDART_VERSION >= 12080
      return quantized && capability >= 100;
#else
      return false;
#endif
    }
    default: return false;
  }
}

void CudaBackend::synchronize() {
  MXTRAIN_ASSERT(!capturing_, "a host wait inside a captured step (copy_to_host, read_scalar or synchronize)");
  MXTRAIN_CUDA_CHECK(cudaStreamSynchronize(stream_));
}

// ---- step graphs --------------------------------------------------------------------------------

bool CudaBackend::begin_capture() {
  if (capturing_) return false;
  drop_capture();
  const cudaError_t status = cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed);
  if (status != cudaSuccess) {
    cudaGetLastError();
    log::info(strf("cuda: cannot capture the step in a CUDA graph (%s); it runs op by op", cudaGetErrorString(status)));
    return false;
  }
  capturing_ = true;
  return true;
}

bool CudaBackend::end_capture() {
  MXTRAIN_ASSERT(capturing_, "end_capture without begin_capture");
  capturing_ = false;
  cudaGraph_t graph = nullptr;
  cudaError_t status = cudaStreamEndCapture(stream_, &graph);
  if (status == cudaSuccess) status = cudaGraphInstantiateWithFlags(&graph_, graph, 0);
  size_t nodes = 0;
  if (status == cudaSuccess) status = cudaGraphGetNodes(graph, nullptr, &nodes);
  if (graph) cudaGraphDestroy(graph);
  if (status != cudaSuccess) {
    cudaGetLastError();
    drop_capture();
    log::info(strf("cuda: the step could not be captured in a CUDA graph (%s); it runs op by op",
                   cudaGetErrorString(status)));
    return false;
  }
  allocations_at_capture_ = memory_stats().allocations;
  const std::string line = strf("cuda: the step replays as a CUDA graph of %zu nodes (%zu host copies)", nodes,
                                host_inputs_.size());
  if (logged_capture_) {
    log::debug(line);
  } else {
    log::info(line);
    logged_capture_ = true;
  }
  return true;
}

bool CudaBackend::replay() {
  if (graph_ == nullptr) return false;
  if (memory_stats().allocations != allocations_at_capture_) {
    log::debug("cuda: memory was allocated since the step was captured; the graph is dropped");
    drop_capture();
    return false;
  }
  // Each staging buffer is refilled once the previous replay's copy has read it (for a step's
  // inputs, at its start), so this replay queues while that one still runs.
  for (const HostInput& input : host_inputs_) {
    MXTRAIN_CUDA_CHECK(cudaEventSynchronize(input.read));
    std::memcpy(input.staging, input.host, input.bytes);
  }
  MXTRAIN_CUDA_CHECK(cudaGraphLaunch(graph_, stream_));
  return true;
}

void CudaBackend::drop_capture() {
  if (capturing_) {  // an op failed mid-capture: end it, keep nothing
    capturing_ = false;
    cudaGraph_t graph = nullptr;
    cudaStreamEndCapture(stream_, &graph);
    if (graph) cudaGraphDestroy(graph);
    cudaGetLastError();
  }
  if (graph_ != nullptr || !host_inputs_.empty()) cudaStreamSynchronize(stream_);
  if (graph_ != nullptr) cudaGraphExecDestroy(graph_);
  graph_ = nullptr;
  for (const HostInput& input : host_inputs_) {
    cudaFreeHost(input.staging);
    cudaEventDestroy(input.read);
  }
  host_inputs_.clear();
}

uint64_t CudaBackend::record_timestamp() {
  const uint64_t id = next_timestamp_++;
  MXTRAIN_CUDA_CHECK(cudaEventRecord(events_[id % kTimestampSlots], stream_));
  return id;
}

double CudaBackend::elapsed_ms(uint64_t start, uint64_t end) {
  MXTRAIN_ASSERT(start <= end && end < next_timestamp_ && next_timestamp_ - start <= kTimestampSlots,
                 "elapsed_ms(%llu, %llu): marks must be recent (at most %d outstanding)",
                 static_cast<unsigned long long>(start), static_cast<unsigned long long>(end), kTimestampSlots);
  cudaEvent_t end_event = events_[end % kTimestampSlots];
  MXTRAIN_CUDA_CHECK(cudaEventSynchronize(end_event));
  float ms = 0;
  MXTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, events_[start % kTimestampSlots], end_event));
  return ms;
}

void CudaBackend::set_deterministic_attention(bool deterministic) { attention_->set_deterministic(deterministic); }
bool CudaBackend::deterministic_attention() const { return attention_->deterministic(); }
void CudaBackend::set_flash_attention_4_backward(bool enabled) { attention_->set_flash_attention_4_backward(enabled); }
bool CudaBackend::flash_attention_4_backward() const { return attention_->flash_attention_4_backward(); }
int CudaBackend::quack_gemm_shapes() const { return gemm_->quack_choices(); }
void CudaBackend::check_attention_backward(const AttentionShape& shape, DType activations) const {
  attention_->check_backward(shape, activations == DType::f32 ? DType::bf16 : activations);
}
void CudaBackend::set_tf32(bool enabled) { gemm_->set_tf32(enabled); }
void CudaBackend::set_fused_bias_gradient(bool fused) { fused_bias_gradient_ = fused; }
bool CudaBackend::tf32() const { return gemm_->tf32(); }
size_t CudaBackend::attention_workspace_bytes() const { return attention_->workspace_bytes(); }

// ---- data movement ------------------------------------------------------------------------------

void CudaBackend::impl_fill(const Tensor& out, float value) {
  // Zero is all-zero bits in every float dtype: the copy engine's memset writes it at full
  // bandwidth (the fill kernel reached about half of it on gradient buffers).
  if (value == 0.0f && !std::signbit(value) && out.is_contiguous()) {
    MXTRAIN_CUDA_CHECK(cudaMemsetAsync(out.data, 0, out.bytes(), stream_));
    return;
  }
  cuda_kernels::fill(out, value, stream_);
}

void CudaBackend::impl_copy(const Tensor& source, const Tensor& out) {
  if (source.dtype == out.dtype) {
    MXTRAIN_CUDA_CHECK(cudaMemcpyAsync(out.data, source.data, out.bytes(), cudaMemcpyDeviceToDevice, stream_));
    return;
  }
  if (!is_float(source.dtype) || !is_float(out.dtype)) {
    throw Error(ErrorKind::unsupported,
                strf("cuda copy converts between f32, bf16 and f16 only, not %s -> %s",
                     std::string(dtype_name(source.dtype)).c_str(), std::string(dtype_name(out.dtype)).c_str()),
                "quantize through the precision recipe's ops instead of copy()");
  }
  cuda_kernels::convert(source, out, stream_);
}

void CudaBackend::impl_copy_from_host(const void* host, const Tensor& out) {
  if (capturing_) {
    // A copy node from staging of its own, which replay() refills from `host`.
    // An event record node after it tells replay() when the staging may be refilled.
    HostInput input{host, nullptr, out.bytes(), nullptr};
    MXTRAIN_CUDA_CHECK(cudaHostAlloc(&input.staging, out.bytes(), cudaHostAllocDefault));
    MXTRAIN_CUDA_CHECK(cudaEventCreateWithFlags(&input.read, cudaEventDisableTiming));
    host_inputs_.push_back(input);
    MXTRAIN_CUDA_CHECK(cudaMemcpyAsync(out.data, input.staging, out.bytes(), cudaMemcpyHostToDevice, stream_));
    MXTRAIN_CUDA_CHECK(cudaEventRecordWithFlags(input.read, stream_, cudaEventRecordExternal));
    return;
  }
  // Pageable host memory is staged before cudaMemcpyAsync returns; pinned memory is read by
  // the DMA later, so wait for it: either way the caller may reuse `host` on return.
  cudaPointerAttributes attributes{};
  MXTRAIN_CUDA_CHECK(cudaPointerGetAttributes(&attributes, host));
  MXTRAIN_CUDA_CHECK(cudaMemcpyAsync(out.data, host, out.bytes(), cudaMemcpyHostToDevice, stream_));
  if (attributes.type == cudaMemoryTypeHost) synchronize();
}

void CudaBackend::impl_copy_to_host(const Tensor& source, void* host) {
  MXTRAIN_CUDA_CHECK(cudaMemcpyAsync(host, source.data, source.bytes(), cudaMemcpyDeviceToHost, stream_));
  synchronize();
}

// ---- model ops ----------------------------------------------------------------------------------

void CudaBackend::impl_embedding_forward(const Tensor& tokens, const Tensor& token_table,
                                         const Tensor& position_table, const Tensor& out, int64_t seq_len) {
  cuda_kernels::embedding_forward(tokens, token_table, position_table, out, seq_len, stream_);
}

void CudaBackend::impl_embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                                          const Tensor& dposition_table, int64_t seq_len) {
  cuda_kernels::embedding_backward(*this, tokens, dout, dtoken_table, dposition_table, seq_len, stream_, &device_facts_);
}

void CudaBackend::impl_norm_forward(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                    const Tensor& out, const Tensor& mean, const Tensor& rstd, float eps,
                                    const Tensor& out_amax) {
  cuda_kernels::norm_forward(kind, Tensor(), Tensor(), x, weight, bias, out, mean, rstd, eps, out_amax, stream_);
}

void CudaBackend::impl_add_norm_forward(NormKind kind, const Tensor& a, const Tensor& b, const Tensor& sum,
                                        const Tensor& weight, const Tensor& bias, const Tensor& out,
                                        const Tensor& mean, const Tensor& rstd, float eps, const Tensor& out_amax) {
  cuda_kernels::norm_forward(kind, a, b, sum, weight, bias, out, mean, rstd, eps, out_amax, stream_);
}

void CudaBackend::impl_norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                                     const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                                     const Tensor& dbias, bool accumulate_dx, bool accumulate_dparams,
                                     const Tensor& dx_amax, const DxColumnSums& dx_sums) {
  cuda_kernels::norm_backward(*this, kind, dout, x, weight, mean, rstd, dx, dweight, dbias, accumulate_dx,
                              accumulate_dparams, dx_amax, dx_sums, stream_);
}

void CudaBackend::impl_gemm(const GemmArgs& args) {
  if (args.a.is_quantized()) {
    // The residual rides on the epilogue (C) where the scalars are host-side (not NVFP4's).
    if (args.residual.defined()) {
      const QuantizedTensor &a = args.a.quantized, &b = args.b.quantized;
      if (a.spec.mode != ScalingMode::nvfp4 && supports(OpKind::linear_forward, DType::e4m3) &&
          gemm_->linear_quantized_residual(a, b, args.bias, args.residual, args.out, stream_))
        return;
      log_unfused_residual();
      gemm_epilogue_apart(args);
      return;
    }
    gemm_quantized(args.role, args.a.quantized, args.b.quantized, args.bias, args.out, args.accumulate);
    return;
  }
  const Tensor &a = args.a.tensor, &b = args.b.tensor;
  switch (args.role) {
    case GemmRole::forward:
      if (args.epilogue == GemmEpilogue::gelu_aux_bias) {
        gemm_forward_gelu(args);
      } else if (args.epilogue == GemmEpilogue::swiglu_aux) {
        gemm_forward_swiglu(args);
      } else if (args.residual.defined()) {
        gemm_forward_residual(args);
      } else {
        gemm_->linear_forward(a, b, args.bias, args.out, stream_);
      }
      return;
    case GemmRole::backward_input:
      if (args.epilogue == GemmEpilogue::dgelu) {
        gemm_backward_input_gelu(args);
      } else {
        gemm_->linear_backward_input(a, b, args.out, args.accumulate, stream_);
      }
      return;
    case GemmRole::backward_weight:
      gemm_backward_weight(a, b, args.out, args.bias_gradient, args.accumulate);
      return;
  }
}

bool CudaBackend::gemm_fuses_swiglu(DType dtype, int64_t k, int64_t ffn) const {
  return gemm_->quack_swiglu() && properties_.compute_capability == 90 && dtype == DType::bf16 && k % 8 == 0 &&
         ffn % 8 == 0;
}

bool CudaBackend::gemm_fuses_dgelu_bias_gradient(DType dtype, int64_t k, int64_t n) const {
  // gemm_->quack_gelu_gemms() is set only where the build carries the kernels and the GPU is an sm_90.
  return gemm_->quack_gelu_gemms() && dtype == DType::bf16 && k % 8 == 0 && n % 8 == 0;
}

void CudaBackend::gemm_forward_swiglu(const GemmArgs& args) {
  if (gemm_->linear_forward_swiglu(args.a.tensor, args.b.tensor, args.aux, args.out, stream_)) return;
  if (!logged_unfused_swiglu_) {
    logged_unfused_swiglu_ = true;
    log::info(strf("cuda: quack's gated GEMM cannot take %s (16-byte aligned BF16 rows, multiples of 8); the GEMM "
                   "and the SwiGLU kernel run apart", args.out.describe().c_str()));
  }
  gemm_epilogue_apart(args);
}

void CudaBackend::gemm_forward_residual(const GemmArgs& args) {
  if (gemm_->linear_forward_residual(args.a.tensor, args.b.tensor, args.bias, args.residual, args.out, stream_)) return;
  log_unfused_residual();
  gemm_epilogue_apart(args);
}

void CudaBackend::log_unfused_residual() {
  if (logged_unfused_residual_) return;
  logged_unfused_residual_ = true;
  log::info("cuda: cuBLASLt has no beta = 1 algorithm for a residual GEMM at this shape; the GEMM and an add run");
}

void CudaBackend::gemm_forward_gelu(const GemmArgs& args) {
  if (gemm_->linear_forward_gelu(args.a.tensor, args.b.tensor, args.bias, args.aux, args.out, stream_)) return;
  log_unfused_gelu("linear_forward_gelu", args.out);
  gemm_epilogue_apart(args);
}

void CudaBackend::gemm_backward_input_gelu(const GemmArgs& args) {
  const Tensor& dx = args.out;
  if (!args.bias_gradient.defined()) {
    if (gemm_->linear_backward_input_gelu(args.a.tensor, args.b.tensor, args.aux, dx, stream_)) return;
    log_unfused_gelu("linear_backward_input_gelu", dx);
    gemm_epilogue_apart(args);
    return;
  }
  // With the bias gradient (gemm_fuses_dgelu_bias_gradient): its partial sums come from quack's
  // DGELU GEMM, or from the column-partials kernel after cuBLASLt's (or after the GEMM and GELU
  // apart), into one buffer; then summed in order into the bias gradient.
  std::vector<Buffer> scratch = private_buffers::allocate_private(*this, private_buffers::dgelu_bias_gradient(dx));
  CublasLtGemm::BiasPartials bias;
  if (!scratch.empty()) {
    bias.partials = scratch.front().tensor().ptr<float>();
    bias.column_partials = [&] { return cuda_kernels::column_partials(dx, bias.partials, stream_); };
  }
  if (!gemm_->linear_backward_input_gelu(args.a.tensor, args.b.tensor, args.aux, dx, stream_, &bias)) {
    log_unfused_gelu("linear_backward_input_gelu", dx);
    gemm_epilogue_apart(args);
    bias.rows = cuda_kernels::column_partials(dx, bias.partials, stream_);
  }
  if (bias.rows == 0) {  // no rows: an empty sum
    if (!args.bias_gradient_accumulate) cuda_kernels::fill(args.bias_gradient, 0.0f, stream_);
    return;
  }
  MXTRAIN_ASSERT(bias.rows <= scratch.front().tensor().rows(), "dgelu bias gradient: %lld partial rows in a buffer of %lld",
                 static_cast<long long>(bias.rows), static_cast<long long>(scratch.front().tensor().rows()));
  cuda_kernels::reduce_column_partials(bias.partials, bias.rows, args.bias_gradient, args.bias_gradient_accumulate,
                                       stream_);
}

void CudaBackend::log_unfused_gelu(const char* op, const Tensor& out) {
  if (logged_unfused_gelu_) return;
  logged_unfused_gelu_ = true;
  log::info(strf("cuda %s: no cuBLASLt GELU epilogue for %s (it needs 16-bit operands with rows a multiple of 8); "
                 "the GEMM and the GELU kernel run apart", op, out.describe().c_str()));
}

void CudaBackend::gemm_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight,
                                       const Tensor& dbias, bool accumulate) {
  if (x.rows() == 0) {  // an empty sum: nothing to add, zeros to overwrite with
    if (!accumulate) {
      cuda_kernels::fill(dweight, 0.0f, stream_);
      if (dbias.defined()) cuda_kernels::fill(dbias, 0.0f, stream_);
    }
    return;
  }
  // cuBLASLt has no f32-input GEMM with a 16-bit output: with f32 activations and bf16/f16
  // gradients the product goes to an f32 scratch, then is added into dweight (one rounding).
  // The bias gradient either rides on the weight GEMM (BGRADB epilogue into an f32 scratch,
  // added to dbias after) or comes from the deterministic column-sum kernel; which one is the
  // backend's setting (the column sums are the default, measured faster: cuda_backend.hpp).
  // Without a BGRADB algorithm for the shape the column sums run.
  const bool via_f32 = x.dtype == DType::f32 && dweight.dtype != DType::f32;
  const bool fused_bias = dbias.defined() && fused_bias_gradient_;
  std::vector<Buffer> scratch =
      private_buffers::allocate_private(*this, private_buffers::linear_backward_weight(dout, x, dweight, dbias,
                                                                                       fused_bias_gradient_));
  MXTRAIN_ASSERT(scratch.size() == static_cast<size_t>(via_f32) + static_cast<size_t>(fused_bias),
                 "linear_backward_weight: %zu scratch buffers", scratch.size());
  const Tensor& product = via_f32 ? scratch.front().tensor() : Tensor();
  const Tensor& target = via_f32 ? product : dweight;
  bool bias_pending = dbias.defined();
  bool gemm_done = false;
  if (fused_bias) {
    float* sums = scratch.back().tensor().ptr<float>();
    if (gemm_->linear_backward_weight(dout, x, target, sums, accumulate && !via_f32, stream_)) {
      cuda_kernels::accumulate_f32(sums, dbias, accumulate, stream_);
      bias_pending = false;
      gemm_done = true;
    } else if (!logged_bias_gradient_path_) {
      logged_bias_gradient_path_ = true;
      log::info("cuda linear_backward_weight: cuBLASLt has no BGRADB algorithm for this shape; the bias "
                "gradient runs as a column-sum kernel");
    }
  }
  if (!gemm_done) gemm_->linear_backward_weight(dout, x, target, nullptr, accumulate && !via_f32, stream_);
  if (bias_pending) cuda_kernels::column_sum(*this, dout, dbias, accumulate, stream_);
  if (via_f32) cuda_kernels::accumulate_f32(product.ptr<float>(), dweight, accumulate, stream_);
}

const float* CudaBackend::rope_table(int64_t seq, int64_t head_dim, const RopeSpec& rope) {
  // seq: the table's positions (private_buffers::rope_table_positions).
  auto key = std::make_tuple(seq, head_dim, rope);
  auto found = rope_tables_.find(key);
  if (found != rope_tables_.end()) return found->second.tensor().ptr<float>();
  // The CPU oracle's frequencies (rope_inverse_frequencies, torch's formula): all in f32.
  const int64_t half = head_dim / 2;
  const std::vector<float> inv_freq = rope_inverse_frequencies(head_dim, rope);
  std::vector<float> table(static_cast<size_t>(2 * seq * half));
  for (int64_t position = 0; position < seq; ++position) {
    for (int64_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(position) * inv_freq[static_cast<size_t>(i)];
      table[static_cast<size_t>(position * half + i)] = std::cos(angle);
      table[static_cast<size_t>((seq + position) * half + i)] = std::sin(angle);
    }
  }
  Buffer buffer = private_buffers::allocate_private(*this, private_buffers::rope_table(seq, head_dim));
  MXTRAIN_ASSERT(buffer.tensor().numel() == static_cast<int64_t>(table.size()), "rope table of %s",
                 buffer.tensor().describe().c_str());
  MXTRAIN_CUDA_CHECK(cudaMemcpyAsync(buffer.tensor().data, table.data(), table.size() * sizeof(float),
                                     cudaMemcpyHostToDevice, stream_));
  synchronize();  // once per shape: `table` dies on return
  const float* pointer = buffer.tensor().ptr<float>();
  rope_tables_.emplace(key, std::move(buffer));
  return pointer;
}

void CudaBackend::impl_rope(const Tensor& qkv, const AttentionShape& shape, const RopeSpec& rope, bool inverse,
                            const Tensor& out_amax) {
  MXTRAIN_ASSERT(qkv.is_contiguous(), "rope: %s must be contiguous", qkv.describe().c_str());
  MXTRAIN_ASSERT(shape.head_dim % 2 == 0 && rope.theta > 0, "rope: head_dim %lld, theta %g",
                 static_cast<long long>(shape.head_dim), static_cast<double>(rope.theta));
  const int64_t positions = private_buffers::rope_table_positions(shape.seq, shape.position_offset);
  cuda_kernels::rope(qkv, shape, rope_table(positions, shape.head_dim, rope), positions, inverse, out_amax, stream_);
}

void CudaBackend::impl_attention_cached(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                                        const Tensor& out, const AttentionShape& shape) {
  MXTRAIN_ASSERT(qkv.is_contiguous() && out.is_contiguous(), "attention_cached: %s and %s must be contiguous",
                 qkv.describe().c_str(), out.describe().c_str());
  cuda_kernels::attention_cached(qkv, k_cache, v_cache, out, shape, stream_);
}

void CudaBackend::impl_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                         const AttentionShape& shape) {
  attention_->forward(qkv, out, lse, shape, stream_);
}

void CudaBackend::impl_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                          const Tensor& dqkv, const AttentionShape& shape) {
  attention_->backward(dout, qkv, out, lse, dqkv, shape, stream_);
}

void CudaBackend::impl_swiglu_forward(const Tensor& gate_up, const Tensor& out, const Tensor& out_amax) {
  cuda_kernels::swiglu_forward(gate_up, out, out_amax, stream_);
}

void CudaBackend::impl_swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up,
                                       const Tensor& out_amax) {
  cuda_kernels::swiglu_backward(dout, gate_up, dgate_up, out_amax, stream_);
}

void CudaBackend::impl_gelu_forward(const Tensor& x, const Tensor& out, const Tensor& out_amax) {
  cuda_kernels::gelu_forward(x, out, out_amax, stream_);
}

void CudaBackend::impl_gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, const Tensor& out_amax) {
  cuda_kernels::gelu_backward(dout, x, dx, out_amax, stream_);
}

void CudaBackend::impl_add(const Tensor& a, const Tensor& b, const Tensor& out) {
  cuda_kernels::add(a, b, out, stream_);
}

bool CudaBackend::fuses_head_loss(const HeadLossChunk& c) const {
  if (!head_loss_quack_) return false;
  const std::string unfusable = private_buffers::head_loss_unfusable(c);
  if (!unfusable.empty() && !logged_unfused_head_loss_) {
    logged_unfused_head_loss_ = true;
    log::info("cuda: train.head_loss = quack-lce needs " + unfusable + "; the LM head of " + c.logits.describe() +
              " runs chunked");
  }
  return unfusable.empty();
}

void CudaBackend::impl_head_loss_fused(const HeadLossChunk& c) {
  const private_buffers::HeadLossPlan plan = private_buffers::head_loss(c);
  const std::vector<Buffer> held = private_buffers::allocate_private(*this, plan.buffers);
  const int64_t rows = c.x.rows(), vocab = c.logits.cols();
  float* partials = static_cast<float*>(held[1].tensor().data);
  float* row_values = static_cast<float*>(held[2].tensor().data);
  cuda_kernels::LceGlue g;
  quack_gemm::LinearCrossEntropy& l = g.lce;
  l.rows = rows;
  l.hidden = c.x.cols();
  l.vocab = vocab;
  l.tile = plan.tile;
  l.x = c.x.data;
  l.weight = c.weight.data;
  l.targets = static_cast<const int32_t*>(c.targets.data);
  l.mask = static_cast<const float*>(held[0].tensor().data);
  l.e = c.logits.data;
  l.sum_exp = partials;
  l.offsets = partials + rows * plan.partials_ld;
  l.partials_ld = plan.partials_ld;
  l.target_logits = row_values;
  l.strip = held[3].tensor().data;
  l.row_scale = row_values + 2 * rows;
  l.xs = held[4].tensor().data;
  l.dx = c.dx.data;
  l.dweight = static_cast<float*>(c.dweight.data);
  g.valid_vocab = c.valid_vocab;
  g.losses = static_cast<float*>(c.losses.data);
  g.row_max = row_values + rows;
  g.grad_scale = c.grad_scale;
  const std::string unsupported = quack_gemm::lce_unsupported(l);
  MXTRAIN_ASSERT(unsupported.empty(), "head_loss: %s", unsupported.c_str());
  MXTRAIN_ASSERT(plan.tiles == vocab / plan.tile, "head_loss: %lld tiles planned for %lld columns",
                 static_cast<long long>(plan.tiles), static_cast<long long>(vocab));
  cuda_kernels::lce_column_mask(held[0].tensor().data, vocab, c.valid_vocab, stream_);
  quack_gemm::lce_forward(l, stream_);
  cuda_kernels::lce_glue(g, stream_);
  quack_gemm::lce_weight_grad(l, c.accumulate, stream_);
  quack_gemm::lce_input_grad(l, stream_);
}

void CudaBackend::impl_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                                     int64_t valid_vocab, float grad_scale) {
  MXTRAIN_ASSERT(logits.is_contiguous(), "cross_entropy: %s must be contiguous", logits.describe().c_str());
  cuda_kernels::cross_entropy(logits, targets, losses, valid_vocab, grad_scale, stream_);
}

void CudaBackend::impl_sum(const Tensor& x, const Tensor& out, bool accumulate, bool squares) {
  MXTRAIN_ASSERT(x.is_contiguous(), "sum: %s must be contiguous", x.describe().c_str());
  cuda_kernels::sum(x, out, accumulate, squares, reduction_partials_.tensor().ptr<float>(), stream_);
}

void CudaBackend::impl_scale(const Tensor& x, float factor) { cuda_kernels::scale(x, factor, stream_); }

void CudaBackend::impl_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                             const Tensor& compute_copy, const Tensor& grad_norm_sq, const AdamWArgs& args) {
  cuda_kernels::adamw(*this, param, grad, m, v, compute_copy, grad_norm_sq, args, stream_);
}

// ---- precision recipes --------------------------------------------------------------------------

void CudaBackend::impl_amax(const Tensor& x, const Tensor& out, bool accumulate, bool hadamard_transposed) {
  cuda_kernels::amax(x, out, accumulate, hadamard_transposed, stream_);
}

void CudaBackend::impl_quantize(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                                const QuantizedTensor& columnwise, const Tensor& amax, const ScaleFromAmax& from) {
  // The block kernels store whole 8- and 16-byte groups of codes.
  auto aligned = [](const Tensor& t) { return (reinterpret_cast<uintptr_t>(t.data) & 15u) == 0; };
  for (const QuantizedTensor* copy : {&rowwise, &columnwise}) {
    MXTRAIN_ASSERT(!copy->data.defined() || aligned(copy->data), "quantize: %s must be 16-byte aligned",
                   copy->data.describe().c_str());
  }
  cuda_kernels::quantize(x, scale, rowwise, columnwise, amax, from, stream_);
}

void CudaBackend::impl_quantize_produced(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                                         const QuantizedTensor& columnwise, const Tensor& amax,
                                         const CastProducer& producer) {
  const float* table = nullptr;
  int64_t positions = 0;
  if (producer.op == CastProducer::Op::rope_backward) {
    positions = private_buffers::rope_table_positions(producer.shape.seq, producer.shape.position_offset);
    table = rope_table(positions, producer.shape.head_dim, producer.rope);
  }
  cuda_kernels::quantize_produced(x, scale, rowwise, columnwise, amax, producer, table, positions, stream_);
}

void CudaBackend::impl_dequantize(const QuantizedTensor& q, const Tensor& out) {
  cuda_kernels::dequantize(q, out, stream_);
}

void CudaBackend::gemm_quantized(GemmRole role, const QuantizedTensor& a, const QuantizedTensor& b,
                                 const Tensor& bias, const Tensor& out, bool accumulate) {
  const DType format = a.spec.mode == ScalingMode::per_tensor ? DType::e4m3
                       : a.spec.mode == ScalingMode::mxfp8   ? DType::e8m0
                                                              : DType::e2m1;
  if (!supports(OpKind::linear_forward, format))
    throw Error(ErrorKind::unsupported,
                strf("%s has no %s quantized GEMM (compute capability %d)", properties_.name.c_str(),
                     scaling_mode_name(a.spec.mode), properties_.compute_capability),
                "the precision recipe emulates this GEMM where supports() says no; this call is a bug");
  MXTRAIN_ASSERT(a.spec.mode == ScalingMode::per_tensor || (a.spec.swizzled_scales && b.spec.swizzled_scales),
                 "block-scaled GEMMs read swizzled scales");
  MXTRAIN_ASSERT(!bias.defined() || bias.dtype == out.dtype, "linear_quantized: bias %s for out %s",
                 bias.describe().c_str(), out.describe().c_str());
  if (a.spec.mode != ScalingMode::nvfp4) {
    gemm_->linear_quantized(role, a, b, bias, out, accumulate, nullptr, stream_);
    return;
  }
  std::vector<Buffer> scratch = private_buffers::allocate_private(*this, private_buffers::linear_quantized(a.spec.mode));
  const Buffer& scalars = scratch.at(0);
  cuda_kernels::nvfp4_gemm_scalars(a.amax, b.amax, accumulate ? 1.0f : 0.0f, scalars.tensor().ptr<float>(), stream_);
  gemm_->linear_quantized(role, a, b, bias, out, accumulate, scalars.tensor().ptr<float>(), stream_);
}

void CudaBackend::impl_fp8_scale_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inverse,
                                        const ScaleUpdateArgs& args) {
  cuda_kernels::fp8_scale_update(history, scale, scale_inverse, args, stream_);
}

void CudaBackend::impl_column_sum(const Tensor& x, const Tensor& out, bool accumulate) {
  cuda_kernels::column_sum(*this, x, out, accumulate, stream_);
}

void CudaBackend::impl_qkv_bias_gradient(const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                                         const Tensor& qkv_bias_grad, bool accumulate) {
  cuda_kernels::qkv_bias_gradient(*this, dqkv, out_bias_grad, out_weight, qkv_bias_grad, accumulate, stream_);
}

}  // namespace mxtrain
