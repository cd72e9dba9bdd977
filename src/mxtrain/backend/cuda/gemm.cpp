#include "mxtrain/backend/cuda/gemm.hpp"

#include <cstdlib>
#include <functional>
#include <vector>

#include "mxtrain/backend/cuda/cuda_check.hpp"
#include "mxtrain/backend/cuda/quack_gemm.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"

namespace mxtrain {

struct CublasLtGemm::Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's order; algo = the chosen one
  std::vector<int> quack;  // quack's configurations that can run the call (autotune candidates too)
  int quack_choice = -1;   // the chosen one's position in `quack`, or -1: cuBLASLt's algo runs
  bool available = false;
  bool tuned = false;

  Plan() = default;
  Plan(const Plan&) = delete;
  Plan& operator=(const Plan&) = delete;
  ~Plan() {
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (desc) cublasLtMatmulDescDestroy(desc);
  }
};

namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (dtype) {
    case DType::f32: return CUDA_R_32F;
    case DType::bf16: return CUDA_R_16BF;
    case DType::f16: return CUDA_R_16F;
    case DType::e4m3: return CUDA_R_8F_E4M3;
    case DType::e5m2: return CUDA_R_8F_E5M2;
    case DType::e2m1: return CUDA_R_4F_E2M1;
    default:
      throw Error(ErrorKind::unsupported,
                  strf("cuBLASLt GEMMs take f32, bf16, f16 or fp8 operands, not %s", std::string(dtype_name(dtype)).c_str()),
                  "use bf16 or f32 activations and weights");
  }
}

// Largest power of two (at most 256) dividing the address: the heuristic must only pick
// kernels whose alignment needs these pointers meet.
uint32_t alignment_bytes(const void* pointer) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  uint32_t alignment = 256;
  while (alignment > 1 && address % alignment != 0) alignment /= 2;
  return alignment;
}

const char* epilogue_name(int epilogue) {
  switch (epilogue) {
    case 1: return "bias";
    case 2: return "bias-gradient";
    case 3: return "gelu-aux";
    case 4: return "gelu-aux-bias";
    case 5: return "dgelu";
    default: return "none";
  }
}

// Whether the epilogue reads (or, for BGRADB, writes) the bias vector.
template <typename E>
bool has_bias(E epilogue) {
  return epilogue == E::bias || epilogue == E::bias_gradient_b || epilogue == E::gelu_aux_bias;
}

// The GELU epilogues' operands: 16-bit, rows a multiple of 8 elements (cuBLASLt's aux
// leading-dimension rule), 16-byte aligned.
bool gelu_epilogue_operand(const Tensor& tensor) {
  return (tensor.dtype == DType::bf16 || tensor.dtype == DType::f16) && tensor.is_contiguous() &&
         tensor.cols() % 8 == 0 && reinterpret_cast<uintptr_t>(tensor.data) % 16 == 0;
}

void require_contiguous(const Tensor& tensor, const char* op) {
  MXTRAIN_ASSERT(tensor.is_contiguous(), "%s: %s must be contiguous", op, tensor.describe().c_str());
}

// Each trial's time a launch, in short bursts (a warm-up and three launches) per trial, in two
// interleaved rounds; each keeps its faster round. Clocks drift with power while the trials run:
// one round let a candidate measured in a dip lose (a GEMM of GPT-2 1.5B changed algorithm
// between runs, 0.48 vs 0.53 ms in the step), and the minimum is the estimate least moved by such
// dips. (Longer, sustained timing, tried before, measured the candidates under power-limited
// clocks and chose algorithms that made the llama-1b step ~3 ms slower.) trial(i) launches
// candidate i, false when it cannot; such a candidate's time is -1.
template <typename Trial>
std::vector<float> time_trials(size_t count, Trial&& trial, cudaStream_t stream) {
  constexpr int kRepeats = 3, kRounds = 2;
  cudaEvent_t start = nullptr, stop = nullptr;
  MXTRAIN_CUDA_CHECK(cudaEventCreate(&start));
  MXTRAIN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> fastest(count, -1.0f);
  for (int round = 0; round < kRounds; ++round) {
    for (size_t i = 0; i < count; ++i) {
      if (round > 0 && fastest[i] < 0) continue;  // failed to launch in the first round
      if (!trial(i)) continue;                    // warm-up
      MXTRAIN_CUDA_CHECK(cudaEventRecord(start, stream));
      for (int r = 0; r < kRepeats; ++r)
        if (!trial(i)) throw Error(ErrorKind::system, "gemm autotune: a candidate that ran once failed to launch");
      MXTRAIN_CUDA_CHECK(cudaEventRecord(stop, stream));
      MXTRAIN_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      MXTRAIN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      ms /= kRepeats;
      if (fastest[i] < 0 || ms < fastest[i]) fastest[i] = ms;
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return fastest;
}

// The index of the smallest non-negative time (0 when none is).
size_t fastest_index(const std::vector<float>& times) {
  size_t best = 0;
  bool found = false;
  for (size_t i = 0; i < times.size(); ++i) {
    if (times[i] < 0) continue;
    if (!found || times[i] < times[best]) best = i, found = true;
  }
  return best;
}

}  // namespace

int CublasLtGemm::quack_choices() const {
  int count = 0;
  for (const auto& [key, plan] : plans_) count += plan->quack_choice >= 0;
  return count;
}

// The call as quack's GEMMs take it, when they can: BF16 in and out, no epilogue, nothing added,
// no decode scales (a plain GEMM of the three linear ops).
bool CublasLtGemm::quack_product(const Call& call, quack_gemm::Product* p) {
  if (call.epilogue != Epilogue::none || call.beta != 0.0f || call.c != nullptr || call.scaled ||
      call.device_scalars != nullptr || call.a_type != DType::bf16 || call.b_type != DType::bf16 ||
      call.d_type != DType::bf16)
    return false;
  *p = quack_gemm::Product{call.transpose_a, call.transpose_b, call.m,   call.n,   call.k,  call.a,
                           call.lda,        call.b,           call.ldb, call.d, call.ldd};
  return true;
}

CublasLtGemm::CublasLtGemm(void* workspace, size_t workspace_bytes)
    : workspace_(workspace), workspace_bytes_(workspace_bytes) {
  MXTRAIN_CUBLAS_CHECK(cublasLtCreate(&handle_));
}

CublasLtGemm::~CublasLtGemm() {
  plans_.clear();
  if (handle_) cublasLtDestroy(handle_);
}

CublasLtGemm::Plan* CublasLtGemm::plan_for(const Call& call, bool optional) {
  const bool tf32 = tf32_ && call.a_type == DType::f32 && call.b_type == DType::f32;
  Key key{call.transpose_a, call.transpose_b, call.m, call.n, call.k, call.lda, call.ldb, call.ldd,
          static_cast<int64_t>(call.a_type), static_cast<int64_t>(call.b_type), static_cast<int64_t>(call.d_type),
          static_cast<int64_t>(has_bias(call.epilogue) ? call.bias_type : DType::f32),
          static_cast<int64_t>(call.epilogue), call.beta != 0.0f, tf32, alignment_bytes(call.a),
          alignment_bytes(call.b), alignment_bytes(call.d), call.scaled ? 1 + static_cast<int64_t>(call.scaling) : 0,
          call.fast_accumulation, call.device_scalars != nullptr, call.c ? alignment_bytes(call.c) : 0,
          call.aux ? alignment_bytes(call.aux) : 0};
  auto found = plans_.find(key);
  if (found != plans_.end()) return found->second.get();

  auto plan = std::make_unique<Plan>();
  const cublasComputeType_t compute = tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&plan->desc, compute, CUDA_R_32F));
  const cublasOperation_t op_a = call.transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = call.transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_a, sizeof op_a));
  MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_b, sizeof op_b));
  cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  switch (call.epilogue) {
    case Epilogue::none: break;
    case Epilogue::bias: epilogue = CUBLASLT_EPILOGUE_BIAS; break;
    case Epilogue::bias_gradient_b: epilogue = CUBLASLT_EPILOGUE_BGRADB; break;
    case Epilogue::gelu_aux: epilogue = CUBLASLT_EPILOGUE_GELU_AUX; break;
    case Epilogue::gelu_aux_bias: epilogue = CUBLASLT_EPILOGUE_GELU_AUX_BIAS; break;
    case Epilogue::dgelu: epilogue = CUBLASLT_EPILOGUE_DGELU; break;
  }
  MXTRAIN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
  if (call.aux != nullptr) {
    // The pre-activation has D's type and layout (leading dimension ldd).
    const cudaDataType_t aux_type = cuda_type(call.d_type);
    const int64_t aux_ld = call.ldd;
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE,
                                                        &aux_type, sizeof aux_type));
    MXTRAIN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld));
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                        &call.aux, sizeof call.aux));
  }
  if (has_bias(call.epilogue)) {
    const cudaDataType_t bias_type = cuda_type(call.bias_type);
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type,
                                                        sizeof bias_type));
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias,
                                                        sizeof call.bias));
  }
  if (call.scaled) configure_scaling(plan->desc, call);
  MXTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->a, cuda_type(call.a_type), call.transpose_a ? call.k : call.m,
                                                  call.transpose_a ? call.m : call.k, call.lda));
  MXTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->b, cuda_type(call.b_type), call.transpose_b ? call.n : call.k,
                                                  call.transpose_b ? call.k : call.n, call.ldb));
  MXTRAIN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&plan->d, cuda_type(call.d_type), call.m, call.n, call.ldd));

  cublasLtMatmulPreference_t preference = nullptr;
  MXTRAIN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&preference));
  const uint64_t workspace_bytes = workspace_bytes_;
  const uint32_t align_a = alignment_bytes(call.a), align_b = alignment_bytes(call.b), align_d = alignment_bytes(call.d);
  const uint32_t align_c = call.c ? alignment_bytes(call.c) : align_d;
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace_bytes,
                                       sizeof workspace_bytes);
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &align_a, sizeof align_a);
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &align_b, sizeof align_b);
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &align_c, sizeof align_c);
  cublasLtMatmulPreferenceSetAttribute(preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &align_d, sizeof align_d);
  cublasLtMatmulHeuristicResult_t results[kCandidates]{};
  int returned = 0;
  cublasStatus_t status = cublasLtMatmulAlgoGetHeuristic(handle_, plan->desc, plan->a, plan->b, plan->d, plan->d,
                                                         preference, autotune_ ? kCandidates : 1, results, &returned);
  cublasLtMatmulPreferenceDestroy(preference);
  if (status == CUBLAS_STATUS_SUCCESS && returned > 0) {
    for (int i = 0; i < returned; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) plan->candidates.push_back(results[i].algo);
    plan->available = !plan->candidates.empty();
  }
  if (plan->available) {
    plan->algo = plan->candidates.front();
    quack_gemm::Product product;
    if (autotune_ && quack_ && quack_product(call, &product)) plan->quack = quack_gemm::candidates(product);
    plan->tuned = plan->candidates.size() + plan->quack.size() < 2;
  } else if (!optional) {
    throw Error(ErrorKind::unsupported,
                strf("cuBLASLt has no algorithm for the GEMM m=%lld n=%lld k=%lld (op %c%c, A %s, B %s, D %s, "
                     "epilogue %s, alignment %u/%u/%u bytes): %s",
                     static_cast<long long>(call.m), static_cast<long long>(call.n), static_cast<long long>(call.k),
                     call.transpose_a ? 'T' : 'N', call.transpose_b ? 'T' : 'N',
                     std::string(dtype_name(call.a_type)).c_str(), std::string(dtype_name(call.b_type)).c_str(),
                     std::string(dtype_name(call.d_type)).c_str(), epilogue_name(static_cast<int>(call.epilogue)),
                     align_a, align_b, align_d, cublasGetStatusString(status)),
                call.scaled ? "quantized GEMMs need every dimension (hidden, FFN, tokens per micro-batch) a multiple of "
                              "16 (32 for MXFP8); keep such layers in BF16 (precision.bf16_first_layers / "
                              "bf16_last_layers) or use --precision bf16"
                            : "use model dimensions that are multiples of 8 and bf16 or f32 operands");
  }
  Plan* raw = plan.get();
  plans_.emplace(key, std::move(plan));
  return raw;
}

bool CublasLtGemm::run(const Call& call, cudaStream_t stream, bool optional) {
  Plan* plan = plan_for(call, optional);
  if (!plan->available) return false;
  if (has_bias(call.epilogue)) {
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &call.bias,
                                                        sizeof call.bias));
  }
  if (call.aux != nullptr) {
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                        &call.aux, sizeof call.aux));
  }
  if (call.scaled) {
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &call.a_scale,
                                                        sizeof call.a_scale));
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(plan->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &call.b_scale,
                                                        sizeof call.b_scale));
  }
  if (!plan->tuned) tune(plan, call, stream);
  if (plan->quack_choice >= 0) {
    quack_gemm::Product product;
    quack_product(call, &product);
    quack_gemm::run(plan->quack[plan->quack_choice], product, stream);
    return true;
  }
  MXTRAIN_CUBLAS_CHECK(launch(plan, plan->algo, call, call.c ? call.c : call.d, call.d, stream));
  return true;
}

cublasStatus_t CublasLtGemm::launch(Plan* plan, const cublasLtMatmulAlgo_t& algo, const Call& call, const void* c,
                                    void* d, cudaStream_t stream) {
  const float alpha = 1.0f, beta = call.beta;
  const void* alpha_pointer = call.device_scalars ? static_cast<const void*>(call.device_scalars) : &alpha;
  const void* beta_pointer = call.device_scalars ? static_cast<const void*>(call.device_scalars + 1) : &beta;
  return cublasLtMatmul(handle_, plan->desc, alpha_pointer, call.a, plan->a, call.b, plan->b, beta_pointer, c, plan->d,
                        d, plan->d, &algo, workspace_, workspace_bytes_, stream);
}

void CublasLtGemm::tune(Plan* plan, const Call& call, cudaStream_t stream) {
  plan->tuned = true;
  // The trials must not change what the real call computes: they may write D only when D is
  // not also read (beta = 0, or C is another buffer); an accumulating GEMM runs its trials on
  // a scratch D of the same size instead (contents irrelevant to the timing), and keeps the
  // heuristic's first choice when there is no memory for one.
  void* scratch = nullptr;
  const bool reads_d = call.beta != 0.0f && (call.c == nullptr || call.c == call.d);
  if (reads_d || call.device_scalars != nullptr) {
    const size_t bytes = dtype_bytes(call.d_type, static_cast<size_t>(call.ldd) * static_cast<size_t>(call.n));
    if (cudaMalloc(&scratch, bytes) != cudaSuccess) {
      (void)cudaGetLastError();
      log::debug(strf("gemm autotune: no memory for a %zu-byte trial output; m=%lld n=%lld k=%lld keeps the "
                      "heuristic's algorithm", bytes, static_cast<long long>(call.m), static_cast<long long>(call.n),
                      static_cast<long long>(call.k)));
      return;
    }
  }
  void* d = scratch ? scratch : call.d;
  const void* c = scratch ? scratch : (call.c ? call.c : call.d);
  // Candidates 0.. are cuBLASLt's algorithms in the heuristic's order, then quack's
  // configurations (plain BF16 GEMMs only: they neither read D nor need the scratch).
  const size_t algorithms = plan->candidates.size(), total = algorithms + plan->quack.size();
  quack_gemm::Product product;
  if (!plan->quack.empty()) quack_product(call, &product);
  // MXT_TEST_GEMM_QUACK_ONLY (the GPU tests): where quack can run the GEMM, only its
  // configurations are timed, so the tests exercise its path whatever cuBLASLt's speed.
  const bool quack_only = std::getenv("MXT_TEST_GEMM_QUACK_ONLY") != nullptr;
  auto trial = [&](size_t i) -> bool {
    if (quack_only && !plan->quack.empty() && i < algorithms) return false;
    if (i < algorithms) return launch(plan, plan->candidates[i], call, c, d, stream) == CUBLAS_STATUS_SUCCESS;
    quack_gemm::run(plan->quack[i - algorithms], product, stream);
    return true;
  };
  // (The short bursts of time_trials.)
  const std::vector<float> fastest = time_trials(total, trial, stream);
  const size_t best = fastest_index(fastest);
  const float best_ms = fastest[best], first_ms = fastest.front();
  if (scratch) MXTRAIN_CUDA_CHECK(cudaFree(scratch));
  if (best < algorithms) {
    plan->algo = plan->candidates[best];
  } else {
    plan->quack_choice = static_cast<int>(best - algorithms);
  }
  const std::string chosen =
      best < algorithms ? strf("#%zu of %zu", best, algorithms) : quack_gemm::name(plan->quack[best - algorithms]);
  log::info(strf("gemm autotune m=%lld n=%lld k=%lld %c%c: heuristic's first %.4f ms, chose %s%s: %.4f ms",
                  static_cast<long long>(call.m), static_cast<long long>(call.n), static_cast<long long>(call.k),
                  call.transpose_a ? 'T' : 'N', call.transpose_b ? 'T' : 'N', first_ms, chosen.c_str(),
                  plan->quack.empty() ? "" : strf(" (%zu quack configurations timed too)", plan->quack.size()).c_str(),
                  best_ms));
}

void CublasLtGemm::configure_scaling(cublasLtMatmulDesc_t desc, const Call& call) {
  if (call.scaling == ScalingMode::per_tensor) {
    const int8_t fast = call.fast_accumulation ? 1 : 0;
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof fast));
  } else {
    // Blackwell block scaling (cuBLAS >= 12.8); scales in the 128x4 swizzled layout.
    const int32_t mode = call.scaling == ScalingMode::mxfp8 ? CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0
                                                            : CUBLASLT_MATMUL_MATRIX_SCALE_VEC16_UE4M3;
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode));
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode));
  }
  if (call.device_scalars != nullptr) {
    const cublasLtPointerMode_t pointer_mode = CUBLASLT_POINTER_MODE_DEVICE;
    MXTRAIN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pointer_mode,
                                                        sizeof pointer_mode));
  }
}

CublasLtGemm::Call CublasLtGemm::quantized_call(GemmRole role, const QuantizedTensor& a, const QuantizedTensor& b,
                                                const Tensor& bias, const Tensor& out, bool accumulate,
                                                const float* device_scalars) {
  require_contiguous(out, "linear_quantized");
  const int64_t rows = a.rows(), features = b.rows(), k = a.k();
  // Row-major out[N, M] is column-major [M, N] = op(A)[M, K] · op(B)[K, N] with A = b's data
  // (row-major [M, K] read transposed: the T of TN) and B = a's data.
  Call call = product(features, rows, k, b.data, k, a.data, k, out, features);
  call.transpose_a = true;
  call.beta = accumulate ? 1.0f : 0.0f;
  call.scaled = true;
  call.scaling = a.spec.mode;
  call.a_scale = b.scale_inverse.data;
  call.b_scale = a.scale_inverse.data;
  call.fast_accumulation = a.spec.mode == ScalingMode::per_tensor && role == GemmRole::forward;
  call.device_scalars = device_scalars;
  if (bias.defined()) {
    call.epilogue = Epilogue::bias;
    call.bias = bias.data;
    call.bias_type = bias.dtype;
  }
  return call;
}

void CublasLtGemm::linear_quantized(GemmRole role, const QuantizedTensor& a, const QuantizedTensor& b,
                                    const Tensor& bias, const Tensor& out, bool accumulate,
                                    const float* device_scalars, cudaStream_t stream) {
  if (a.rows() == 0 || b.rows() == 0) return;
  run(quantized_call(role, a, b, bias, out, accumulate, device_scalars), stream, false);
}

bool CublasLtGemm::linear_quantized_residual(const QuantizedTensor& a, const QuantizedTensor& b, const Tensor& bias,
                                             const Tensor& residual, const Tensor& out, cudaStream_t stream) {
  require_contiguous(residual, "linear_quantized_residual");
  if (a.rows() == 0 || b.rows() == 0) return true;
  Call call = quantized_call(GemmRole::forward, a, b, bias, out, false, nullptr);
  call.c = residual.data;
  call.beta = 1.0f;
  return run(call, stream, true);
}

CublasLtGemm::Call CublasLtGemm::product(int64_t m, int64_t n, int64_t k, const Tensor& a, int64_t lda,
                                         const Tensor& b, int64_t ldb, const Tensor& d, int64_t ldd) {
  Call call;
  call.m = m;
  call.n = n;
  call.k = k;
  call.a = a.data;
  call.a_type = a.dtype;
  call.lda = lda;
  call.b = b.data;
  call.b_type = b.dtype;
  call.ldb = ldb;
  call.d = d.data;
  call.d_type = d.dtype;
  call.ldd = ldd;
  return call;
}

CublasLtGemm::Call CublasLtGemm::forward_call(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                              const Tensor& out) {
  require_contiguous(x, "linear_forward");
  require_contiguous(weight, "linear_forward");
  require_contiguous(out, "linear_forward");
  // Row-major out[N, M] is column-major [M, N] = weight[M, K] (read transposed) · x.
  const int64_t rows = x.rows(), in = x.cols(), features = weight.size(0);
  Call call = product(features, rows, in, weight, in, x, in, out, features);
  call.transpose_a = true;
  if (bias.defined()) {
    call.epilogue = Epilogue::bias;
    call.bias = bias.data;
    call.bias_type = bias.dtype;
  }
  return call;
}

CublasLtGemm::Call CublasLtGemm::backward_input_call(const Tensor& dout, const Tensor& weight, const Tensor& dx,
                                                     bool accumulate) {
  require_contiguous(dout, "linear_backward_input");
  require_contiguous(weight, "linear_backward_input");
  require_contiguous(dx, "linear_backward_input");
  const int64_t rows = dout.rows(), features = weight.size(0), in = weight.size(1);
  Call call = product(in, rows, features, weight, in, dout, features, dx, in);
  call.beta = accumulate ? 1.0f : 0.0f;
  return call;
}

void CublasLtGemm::linear_forward(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                                  cudaStream_t stream) {
  if (x.rows() == 0) return;
  run(forward_call(x, weight, bias, out), stream, false);
}

bool CublasLtGemm::linear_forward_residual(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                           const Tensor& residual, const Tensor& out, cudaStream_t stream) {
  require_contiguous(residual, "linear_forward_residual");
  if (x.rows() == 0) return true;
  Call call = forward_call(x, weight, bias, out);
  call.c = residual.data;
  call.beta = 1.0f;
  return run(call, stream, true);
}

void CublasLtGemm::linear_backward_input(const Tensor& dout, const Tensor& weight, const Tensor& dx, bool accumulate,
                                         cudaStream_t stream) {
  if (dout.rows() == 0) return;
  run(backward_input_call(dout, weight, dx, accumulate), stream, false);
}

bool CublasLtGemm::linear_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight, float* bias_sum,
                                          bool accumulate, cudaStream_t stream) {
  require_contiguous(dout, "linear_backward_weight");
  require_contiguous(x, "linear_backward_weight");
  require_contiguous(dweight, "linear_backward_weight");
  const int64_t rows = x.rows(), in = x.cols(), features = dout.cols();
  if (rows == 0) return true;
  Call call = product(in, features, rows, x, in, dout, features, dweight, in);
  call.transpose_b = true;
  call.beta = accumulate ? 1.0f : 0.0f;
  if (bias_sum != nullptr) {
    call.epilogue = Epilogue::bias_gradient_b;
    call.bias = bias_sum;
    call.bias_type = DType::f32;
  }
  return run(call, stream, bias_sum != nullptr);
}

bool CublasLtGemm::linear_forward_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& pre,
                                       const Tensor& out, cudaStream_t stream) {
  if (!gelu_epilogue_operand(pre) || !gelu_epilogue_operand(out) || pre.dtype != out.dtype) return false;
  if (x.rows() == 0) return true;
  // D = out (after GELU), aux = pre (before it).
  Call call = forward_call(x, weight, bias, out);
  call.epilogue = bias.defined() ? Epilogue::gelu_aux_bias : Epilogue::gelu_aux;
  call.aux = pre.data;
  if (quack_gelu_ && quack_gelu(x, weight, bias, pre, out, false, [&] { return run(call, stream, true); }, stream))
    return true;
  return run(call, stream, true);
}

bool CublasLtGemm::linear_backward_input_gelu(const Tensor& dout, const Tensor& weight, const Tensor& pre,
                                              const Tensor& dx, cudaStream_t stream, BiasPartials* bias) {
  if (!gelu_epilogue_operand(pre) || !gelu_epilogue_operand(dx) || pre.dtype != dx.dtype) return false;
  if (bias != nullptr) bias->rows = 0;
  if (dout.rows() == 0) return true;
  Call call = backward_input_call(dout, weight, dx, false);
  call.epilogue = Epilogue::dgelu;
  call.aux = pre.data;
  // cuBLASLt's DGELU, then (with the bias) the column partials: what quack's one kernel does,
  // timed as a whole beside it.
  const auto cublaslt = [&] {
    if (!run(call, stream, true)) return false;
    if (bias != nullptr) bias->rows = bias->column_partials();
    return true;
  };
  if (quack_gelu_ && quack_gelu(dout, weight, Tensor(), pre, dx, true, cublaslt, stream,
                                bias != nullptr ? bias->partials : nullptr, bias != nullptr ? &bias->rows : nullptr))
    return true;
  return cublaslt();
}

bool CublasLtGemm::linear_forward_swiglu(const Tensor& x, const Tensor& weight, const Tensor& pre, const Tensor& out,
                                         cudaStream_t stream) {
  if (!quack_swiglu_ || x.dtype != DType::bf16 || weight.dtype != DType::bf16 || pre.dtype != DType::bf16 ||
      out.dtype != DType::bf16)
    return false;
  quack_gemm::Gated g;
  g.rows = x.rows(), g.k = x.cols(), g.ffn = out.cols();
  g.x = x.data, g.w = weight.data, g.preact = pre.data, g.postact = out.data;
  return run_quack_epilogue({0, g.rows, g.k, g.ffn}, quack_gemm::gated_candidates(g), "gated SwiGLU",
                            [&](int candidate) { quack_gemm::run_gated(candidate, g, stream); }, {}, stream);
}

bool CublasLtGemm::quack_gelu(const Tensor& a, const Tensor& weight, const Tensor& bias, const Tensor& pre,
                              const Tensor& out, bool backward, const std::function<bool()>& cublaslt,
                              cudaStream_t stream, float* bias_partials, int64_t* partial_rows) {
  for (const Tensor* t : {&a, &weight, &pre, &out})
    if (t->dtype != DType::bf16 || !t->is_contiguous()) return false;
  if (!backward && (!bias.defined() || bias.dtype != DType::bf16)) return false;
  quack_gemm::Gelu g;
  g.backward = backward;
  g.rows = a.rows(), g.k = a.cols(), g.n = out.cols();
  g.a = a.data, g.w = weight.data, g.bias = backward ? nullptr : bias.data, g.preact = pre.data, g.out = out.data;
  g.bias_partials = bias_partials;
  const int64_t kind = !backward ? 1 : bias_partials == nullptr ? 2 : 3;
  return run_quack_epilogue({kind, g.rows, g.k, g.n}, quack_gemm::gelu_candidates(g),
                            !backward ? "GELU bias" : bias_partials == nullptr ? "DGELU" : "DGELU bias-gradient",
                            [&](int candidate) {
                              quack_gemm::run_gelu(candidate, g, stream);
                              if (partial_rows != nullptr) *partial_rows = quack_gemm::gelu_partial_rows(candidate, g.rows);
                            },
                            cublaslt, stream);
}

bool CublasLtGemm::run_quack_epilogue(const std::array<int64_t, 4>& key, const std::vector<int>& candidates,
                                      const char* what, const std::function<void(int)>& launch,
                                      const std::function<bool()>& cublaslt, cudaStream_t stream) {
  if (candidates.empty()) return false;
  // One choice a shape: with autotuning, the fastest of the carried configurations and (where
  // given) cuBLASLt's own epilogue on this call's operands (the trials write only the call's
  // outputs, which the real call overwrites); else the export's first. -1: cuBLASLt's.
  auto found = epilogue_choice_.find(key);
  if (found == epilogue_choice_.end()) {
    int choice = candidates[0];
    const size_t trials = candidates.size() + (cublaslt ? 1 : 0);
    if (autotune_ && trials > 1) {
      const std::vector<float> times = time_trials(
          trials,
          [&](size_t i) {
            if (i == candidates.size()) return cublaslt();
            launch(candidates[i]);
            return true;
          },
          stream);
      const size_t best = fastest_index(times);
      choice = best < candidates.size() ? candidates[best] : -1;
      log::info(strf("gemm autotune %s rows=%lld k=%lld n=%lld: chose %s: %.4f ms (%zu candidates%s)", what,
                     static_cast<long long>(key[1]), static_cast<long long>(key[2]), static_cast<long long>(key[3]),
                     choice < 0 ? "cuBLASLt's epilogue" : quack_gemm::name(choice).c_str(), times[best], trials,
                     cublaslt ? strf(", cuBLASLt's epilogue %.4f ms", times.back()).c_str() : ""));
    }
    found = epilogue_choice_.emplace(key, choice).first;
  }
  if (found->second < 0) return false;
  launch(found->second);
  return true;
}

}  // namespace mxtrain
