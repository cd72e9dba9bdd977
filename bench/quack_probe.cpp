// Can quack's Hopper GEMMs with fused SwiGLU epilogues (PyPI quack-kernels, compiled ahead of time
// by bench/quack_export.py, no Python at run time) take the SwiGLU passes off a llama MLP without
// losing GEMM speed against cuBLASLt? On a [M, H] x [2F, H] gate/up projection stored [gate; up]
// and a [H, F] down projection, this probe runs, for every exported configuration, the four GEMMs
// a gated MLP needs with quack's interleaved pre-activation —
//   gated   preact, postact = x · W1ᵀ, silu(gate) · up      (forward: GEMM + SwiGLU in one kernel)
//   dgated  dpreact, postact = dSwiGLU(dY · W2, preact)     (backward: GEMM + SwiGLU's backward)
//   dx      dpreact · W1 (W1's rows read interleaved)       dw1  dpreactᵀ · x, written [gate; up]
// — beside cuBLASLt's plain GEMMs of the same shapes (the fastest of its heuristic's first eight
// algorithms, as the trainer's autotune picks), checks quack's outputs against cuBLASLt's plus the
// SwiGLU formulas on sampled rows, and prints each kernel's time. The SwiGLU element-wise kernels
// the trainer runs beside its cuBLASLt GEMMs are not in this binary (g++ only, no device code):
// their times come from the trainer's step timelines.
//
// Built by bench/quack_probe.sh (export + g++ here, run on the GPU machine).
// Usage: quack_probe M H F  (llama-1b: 16384 2048 5632)
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "mxtrain/backend/cuda/tvm_ffi_call.hpp"

namespace {

using mxtrain::tvm_ffi::kBf16;
using mxtrain::tvm_ffi::none;
using mxtrain::tvm_ffi::Packed;
using mxtrain::tvm_ffi::View;
using mxtrain::tvm_ffi::integer;

#define CHECK_CUDA(x)                                                                      \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));       \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)
#define CHECK_LT(x)                                                                        \
  do {                                                                                     \
    cublasStatus_t s_ = (x);                                                               \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                     \
      std::printf("%s:%d %s: cuBLAS status %d\n", __FILE__, __LINE__, #x, int(s_));        \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

// bench/quack_probe.sh generates quack_function_list.inc from the export's manifest: one
// QUACK_FUNCTION(kernel, config) a compiled function.
extern "C" {
#define QUACK_FUNCTION(kernel, config) int __tvm_ffi_mxtrain_quack_##kernel##_##config(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
#include "quack_function_list.inc"
#undef QUACK_FUNCTION
}

struct Function {
  std::string kernel, config;
  Packed fn;
};
const Function kFunctions[] = {
#define QUACK_FUNCTION(kernel, config) {#kernel, #config, __tvm_ffi_mxtrain_quack_##kernel##_##config},
#include "quack_function_list.inc"
#undef QUACK_FUNCTION
};

int cluster_size(const std::string& config) {  // "128x192_c2x1_pp" -> 2
  const size_t c = config.find("_c");
  return std::atoi(config.c_str() + c + 2) * std::atoi(config.c_str() + config.find('x', c) + 1);
}

// A TVM-FFI Array of the given values (tensors go in as ffi.Tensor objects over the views).
struct Array {
  TVMFFIAny any = none();
  std::vector<TVMFFIObjectHandle> owned;
  std::vector<DLManagedTensor> managed;
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  explicit Array(std::vector<TVMFFIAny> elements, std::vector<View*> tensors = {}) {
    managed.resize(tensors.size());
    for (size_t i = 0, t = 0; i < elements.size(); ++i) {
      if (elements[i].type_index != kTVMFFIDLTensorPtr) continue;
      DLManagedTensor& m = managed[t];
      m.dl_tensor = tensors[t]->t;
      m.manager_ctx = nullptr;
      m.deleter = [](DLManagedTensor*) {};  // the views own nothing
      TVMFFIObjectHandle handle = nullptr;
      if (TVMFFITensorFromDLPack(&m, 0, 0, &handle) != 0) fail("ffi.Tensor", mxtrain::tvm_ffi::raised_error());
      owned.push_back(handle);
      elements[i] = TVMFFIAny{};
      elements[i].type_index = kTVMFFITensor;
      elements[i].v_obj = static_cast<TVMFFIObject*>(handle);
      ++t;
    }
    const std::string error =
        mxtrain::tvm_ffi::make_array(elements.data(), static_cast<int>(elements.size()), &any);
    if (!error.empty()) fail("ffi.Array", error);
  }
  ~Array() {
    if (any.type_index >= kTVMFFIStaticObjectBegin) TVMFFIObjectDecRef(any.v_obj);
    for (TVMFFIObjectHandle h : owned) TVMFFIObjectDecRef(h);
  }
  [[noreturn]] static void fail(const char* what, const std::string& why) {
    std::printf("%s: %s\n", what, why.c_str());
    std::exit(1);
  }
};


struct Lt {
  cublasLtHandle_t handle;
  void* workspace;
  size_t workspace_bytes = 64u << 20;
  cudaStream_t stream;
};

// C (m x n, column-major, ldc) = op(P) (m x k) · op(Q) (k x n), bf16 in and out, f32 accumulate;
// `algo` of the heuristic's list, or -1 for the fastest of its first eight (timed here).
struct LtGemm {
  cublasLtMatmulDesc_t desc;
  cublasLtMatrixLayout_t lp, lq, lc;
  std::vector<cublasLtMatmulHeuristicResult_t> algos;
  int chosen = 0;
};

LtGemm lt_gemm(Lt& lt, int64_t m, int64_t n, int64_t k, bool tp, int64_t ldp, bool tq, int64_t ldq, int64_t ldc) {
  LtGemm g;
  CHECK_LT(cublasLtMatmulDescCreate(&g.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t op_p = tp ? CUBLAS_OP_T : CUBLAS_OP_N, op_q = tq ? CUBLAS_OP_T : CUBLAS_OP_N;
  CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_p, sizeof op_p));
  CHECK_LT(cublasLtMatmulDescSetAttribute(g.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_q, sizeof op_q));
  CHECK_LT(cublasLtMatrixLayoutCreate(&g.lp, CUDA_R_16BF, tp ? k : m, tp ? m : k, ldp));
  CHECK_LT(cublasLtMatrixLayoutCreate(&g.lq, CUDA_R_16BF, tq ? n : k, tq ? k : n, ldq));
  CHECK_LT(cublasLtMatrixLayoutCreate(&g.lc, CUDA_R_16BF, m, n, ldc));
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &lt.workspace_bytes,
                                                sizeof lt.workspace_bytes));
  g.algos.resize(8);
  int found = 0;
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt.handle, g.desc, g.lp, g.lq, g.lc, g.lc, pref, 8, g.algos.data(), &found));
  g.algos.resize(found);
  cublasLtMatmulPreferenceDestroy(pref);
  return g;
}

void lt_run(Lt& lt, const LtGemm& g, int algo, const void* p, const void* q, void* c) {
  const float one = 1.0f, zero = 0.0f;
  CHECK_LT(cublasLtMatmul(lt.handle, g.desc, &one, p, g.lp, q, g.lq, &zero, c, g.lc, c, g.lc, &g.algos[algo].algo,
                          lt.workspace, lt.workspace_bytes, lt.stream));
}

template <typename F>
double time_ms(cudaStream_t stream, F&& f, int reps = 20) {
  for (int i = 0; i < 3; ++i) f();
  cudaEvent_t a, b;
  CHECK_CUDA(cudaEventCreate(&a));
  CHECK_CUDA(cudaEventCreate(&b));
  CHECK_CUDA(cudaEventRecord(a, stream));
  for (int i = 0; i < reps; ++i) f();
  CHECK_CUDA(cudaEventRecord(b, stream));
  CHECK_CUDA(cudaEventSynchronize(b));
  float ms = 0;
  CHECK_CUDA(cudaEventElapsedTime(&ms, a, b));
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return ms / reps;
}

// Times each of the heuristic's algorithms and keeps the fastest (the trainer's autotune).
double lt_best(Lt& lt, LtGemm& g, const void* p, const void* q, void* c) {
  double best = 1e30;
  for (int i = 0; i < static_cast<int>(g.algos.size()); ++i) {
    const double ms = time_ms(lt.stream, [&] { lt_run(lt, g, i, p, q, c); }, 10);
    if (ms < best) best = ms, g.chosen = i;
  }
  return time_ms(lt.stream, [&] { lt_run(lt, g, g.chosen, p, q, c); });
}

struct Buf {
  void* d = nullptr;
  int64_t n = 0;
  explicit Buf(int64_t elements) : n(elements) { CHECK_CUDA(cudaMalloc(&d, 2 * elements)); }
  ~Buf() { cudaFree(d); }
  void fill(std::mt19937& rng, float scale) {
    std::vector<__nv_bfloat16> h(n);
    std::normal_distribution<float> dist(0.0f, scale);
    for (auto& v : h) v = __float2bfloat16(dist(rng));
    CHECK_CUDA(cudaMemcpy(d, h.data(), 2 * n, cudaMemcpyHostToDevice));
  }
  std::vector<float> rows(int64_t first, int64_t count, int64_t cols) const {
    std::vector<__nv_bfloat16> h(count * cols);
    CHECK_CUDA(cudaMemcpy(h.data(), static_cast<char*>(d) + 2 * first * cols, 2 * h.size(), cudaMemcpyDeviceToHost));
    std::vector<float> f(h.size());
    for (size_t i = 0; i < h.size(); ++i) f[i] = __bfloat162float(h[i]);
    return f;
  }
};

double rel_l2(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) num += (a[i] - b[i]) * double(a[i] - b[i]), den += double(b[i]) * b[i];
  return std::sqrt(num / std::max(den, 1e-30));
}
float silu(float g) { return g / (1.0f + std::exp(-g)); }
float bf(float x) { return __bfloat162float(__float2bfloat16(x)); }

void call(const Function& f, std::initializer_list<TVMFFIAny> args) {
  const std::string error = mxtrain::tvm_ffi::call(f.fn, args);
  if (error.empty()) return;
  std::printf("%s %s failed: %s\n", f.kernel.c_str(), f.config.c_str(), error.c_str());
  std::exit(1);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::printf("usage: quack_probe M H F\n");
    return 2;
  }
  const int64_t M = std::atoll(argv[1]), H = std::atoll(argv[2]), F = std::atoll(argv[3]), F2 = 2 * F;
  Lt lt;
  CHECK_CUDA(cudaStreamCreateWithFlags(&lt.stream, cudaStreamNonBlocking));
  CHECK_LT(cublasLtCreate(&lt.handle));
  CHECK_CUDA(cudaMalloc(&lt.workspace, lt.workspace_bytes));
  if (TVMFFIEnvSetStream(kDLCUDA, 0, lt.stream, nullptr) != 0) return 1;
  int sms = 0;
  CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  std::mt19937 rng(1234);
  Buf x(M * H), w1(F2 * H), w2(H * F), dy(M * H);
  x.fill(rng, 1.0f), w1.fill(rng, 0.02f), w2.fill(rng, 0.02f), dy.fill(rng, 1.0f);
  Buf preact_q(M * F2), post_q(M * F), dpre_q(M * F2), post2_q(M * F), dx_q(M * H), dw1_q(F2 * H);
  Buf preact_c(M * F2), dh_c(M * F), dpre_c(M * F2), dx_c(M * H), dw1_c(F2 * H);

  // cuBLASLt, row-major C = A · B as column-major Cᵀ = Bᵀ · Aᵀ.
  LtGemm fwd = lt_gemm(lt, F2, M, H, true, H, false, H, F2);     // preact [M, 2F] = x · W1ᵀ
  LtGemm dgrad2 = lt_gemm(lt, F, M, H, false, F, false, H, F);   // dh [M, F] = dY · W2
  LtGemm dgrad1 = lt_gemm(lt, H, M, F2, false, H, false, F2, H);  // dx [M, H] = dpreact · W1
  LtGemm wgrad1 = lt_gemm(lt, H, F2, M, false, H, true, F2, H);   // dW1 [2F, H] = dpreactᵀ · x
  std::printf("# quack_probe M=%lld H=%lld F=%lld (gate/up [%lld, %lld], down [%lld, %lld]), %d SMs\n", (long long)M,
              (long long)H, (long long)F, (long long)F2, (long long)H, (long long)H, (long long)F, sms);
  const double t_fwd = lt_best(lt, fwd, w1.d, x.d, preact_c.d);
  const double t_dgrad2 = lt_best(lt, dgrad2, w2.d, dy.d, dh_c.d);

  // The reference, on sampled rows: SwiGLU and its backward on cuBLASLt's outputs, in f32 from
  // the bf16 GEMM outputs (as the trainer's element-wise kernels do).
  const int64_t kRows = 64;
  std::vector<int64_t> sample_rows = {0, M / 3, M - kRows};
  std::map<std::string, std::pair<double, double>> worst;  // kernel -> (rel L2 max, unused)
  auto note = [&](const std::string& what, double err) { worst[what].first = std::max(worst[what].first, err); };

  std::map<std::string, double> best_quack;
  std::map<std::string, std::string> best_config;
  std::printf("%-7s %-18s %10s %9s\n", "kernel", "config", "ms", "TFLOP/s");
  const double flop_fwd = 2.0 * M * F2 * H, flop_down = 2.0 * M * F * H;
  for (const Function& f : kFunctions) {
    const int64_t clusters = sms / cluster_size(f.config);
    Array sched({integer(clusters), none(), integer(8), none(), none(), none()});
    double ms = 0, flop = 0;
    if (f.kernel == "gated") {
      View a(x.d, kBf16, 0, {M, H}, {H, 1}), b(w1.d, kBf16, 0, {F2, H}, {H, 1}), d(preact_q.d, kBf16, 0, {M, F2}, {F2, 1});
      View post(post_q.d, kBf16, 0, {M, F}, {F, 1});
      Array epi({post.any(), none(), none()}, {&post});
      auto run = [&] { call(f, {a.any(), b.any(), d.any(), none(), epi.any, sched.any, none(), none(), none()}); };
      ms = time_ms(lt.stream, run), flop = flop_fwd;
      CHECK_CUDA(cudaStreamSynchronize(lt.stream));
      for (int64_t r0 : sample_rows) {  // preact interleaved (gate j, up j) against cuBLASLt's [gate | up]
        std::vector<float> q = preact_q.rows(r0, kRows, F2), c = preact_c.rows(r0, kRows, F2), p = post_q.rows(r0, kRows, F);
        std::vector<float> qi(q.size()), post_ref(p.size());
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t j = 0; j < F; ++j) {
            qi[r * F2 + 2 * j] = c[r * F2 + j], qi[r * F2 + 2 * j + 1] = c[r * F2 + F + j];
            post_ref[r * F + j] = bf(silu(c[r * F2 + j]) * c[r * F2 + F + j]);
          }
        note("gated preact", rel_l2(q, qi));
        note("gated postact", rel_l2(p, post_ref));
      }
    } else if (f.kernel == "dgated") {
      // preact_q holds the gated kernel's interleaved pre-activation (gated runs first).
      View a(dy.d, kBf16, 0, {M, H}, {H, 1}), b(w2.d, kBf16, 0, {H, F}, {F, 1}), d(dpre_q.d, kBf16, 0, {M, F2}, {F2, 1});
      View c(preact_q.d, kBf16, 0, {M, F2}, {F2, 1}), post(post2_q.d, kBf16, 0, {M, F}, {F, 1});
      Array epi({post.any(), none(), none()}, {&post});
      auto run = [&] { call(f, {a.any(), b.any(), d.any(), c.any(), epi.any, sched.any, none(), none(), none()}); };
      ms = time_ms(lt.stream, run), flop = flop_down;
      CHECK_CUDA(cudaStreamSynchronize(lt.stream));
      for (int64_t r0 : sample_rows) {
        std::vector<float> pre = preact_q.rows(r0, kRows, F2), dh = dh_c.rows(r0, kRows, F);
        std::vector<float> dq = dpre_q.rows(r0, kRows, F2), pq = post2_q.rows(r0, kRows, F);
        std::vector<float> dref(dq.size()), pref(pq.size());
        for (int64_t r = 0; r < kRows; ++r)
          for (int64_t j = 0; j < F; ++j) {
            const float g = pre[r * F2 + 2 * j], u = pre[r * F2 + 2 * j + 1], d = dh[r * F + j];
            const float sig = 1.0f / (1.0f + std::exp(-g)), s = g * sig;
            dref[r * F2 + 2 * j] = bf(d * u * sig * (1.0f + g * (1.0f - sig)));
            dref[r * F2 + 2 * j + 1] = bf(d * s);
            pref[r * F + j] = bf(s * u);
          }
        note("dgated dpreact", rel_l2(dq, dref));
        note("dgated postact", rel_l2(pq, pref));
      }
    } else if (f.kernel == "dx") {
      View a(dpre_q.d, kBf16, 0, {1, M, F2}, {M * F2, F2, 1}), b(w1.d, kBf16, 0, {1, H, F2}, {H * F2, 1, H});
      View d(dx_q.d, kBf16, 0, {1, M, H}, {M * H, H, 1});
      std::vector<TVMFFIAny> nones(12, none());
      Array epi(nones);
      auto run = [&] { call(f, {a.any(), b.any(), d.any(), none(), epi.any, sched.any, none(), none(), none()}); };
      ms = time_ms(lt.stream, run), flop = 2.0 * M * H * F2;
    } else if (f.kernel == "dw1") {
      View a(dpre_q.d, kBf16, 0, {1, F2, M}, {M * F2, 1, F2}), b(x.d, kBf16, 0, {1, H, M}, {M * H, 1, H});
      View d(dw1_q.d, kBf16, 0, {1, F2, H}, {F2 * H, H, 1});
      std::vector<TVMFFIAny> nones(12, none());
      Array epi(nones);
      auto run = [&] { call(f, {a.any(), b.any(), d.any(), none(), epi.any, sched.any, none(), none(), none()}); };
      ms = time_ms(lt.stream, run), flop = 2.0 * M * H * F2;
    }
    std::printf("%-7s %-18s %10.4f %9.1f\n", f.kernel.c_str(), f.config.c_str(), ms, flop / ms / 1e9);
    if (!best_quack.count(f.kernel) || ms < best_quack[f.kernel]) best_quack[f.kernel] = ms, best_config[f.kernel] = f.config;
  }

  // dx and dW1 against cuBLASLt on quack's dpreact brought back to [gate | up] (host permutation).
  {
    std::vector<__nv_bfloat16> h(M * F2), hc(M * F2);
    CHECK_CUDA(cudaMemcpy(h.data(), dpre_q.d, 2 * h.size(), cudaMemcpyDeviceToHost));
    for (int64_t r = 0; r < M; ++r)
      for (int64_t j = 0; j < F; ++j) hc[r * F2 + j] = h[r * F2 + 2 * j], hc[r * F2 + F + j] = h[r * F2 + 2 * j + 1];
    CHECK_CUDA(cudaMemcpy(dpre_c.d, hc.data(), 2 * hc.size(), cudaMemcpyHostToDevice));
  }
  const double t_dgrad1 = lt_best(lt, dgrad1, w1.d, dpre_c.d, dx_c.d);
  const double t_wgrad1 = lt_best(lt, wgrad1, x.d, dpre_c.d, dw1_c.d);
  CHECK_CUDA(cudaStreamSynchronize(lt.stream));
  // The last dx / dw1 configurations' outputs are in dx_q / dw1_q: every configuration computes the same.
  for (int64_t r0 : sample_rows) note("dx", rel_l2(dx_q.rows(r0, kRows, H), dx_c.rows(r0, kRows, H)));
  for (int64_t r0 : {int64_t{0}, F - kRows, F, F2 - kRows})
    note("dw1", rel_l2(dw1_q.rows(r0, kRows, H), dw1_c.rows(r0, kRows, H)));

  std::printf("\n# cuBLASLt (fastest of the heuristic's first %zu algorithms), plain GEMMs of the same shapes\n",
              fwd.algos.size());
  std::printf("gate/up forward   [M, 2F] = x · W1ᵀ   %8.4f ms %7.1f TFLOP/s\n", t_fwd, flop_fwd / t_fwd / 1e9);
  std::printf("down dgrad        [M, F]  = dY · W2   %8.4f ms %7.1f TFLOP/s\n", t_dgrad2, flop_down / t_dgrad2 / 1e9);
  std::printf("gate/up dgrad     [M, H]  = dpre · W1 %8.4f ms %7.1f TFLOP/s\n", t_dgrad1, 2.0 * M * H * F2 / t_dgrad1 / 1e9);
  std::printf("gate/up wgrad     [2F, H] = dpreᵀ · x %8.4f ms %7.1f TFLOP/s\n", t_wgrad1, 2.0 * M * H * F2 / t_wgrad1 / 1e9);
  std::printf("\n# quack's fastest configuration a kernel, against cuBLASLt's GEMM alone\n");
  const std::pair<const char*, double> lt_of[] = {{"gated", t_fwd}, {"dgated", t_dgrad2}, {"dx", t_dgrad1}, {"dw1", t_wgrad1}};
  for (const auto& [kernel, t] : lt_of)
    if (best_quack.count(kernel))
      std::printf("%-7s %-18s %8.4f ms  cuBLASLt %8.4f ms  difference %+8.4f ms\n", kernel, best_config[kernel].c_str(),
                  best_quack[kernel], t, best_quack[kernel] - t);
  std::printf("\n# relative L2 difference from the reference (sampled rows)\n");
  for (const auto& [what, e] : worst) std::printf("%-16s %.3e\n", what.c_str(), e.first);
  return 0;
}
