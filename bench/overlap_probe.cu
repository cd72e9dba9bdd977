// How much of a bandwidth-bound AdamW-like update hides behind compute-bound cuBLASLt GEMMs when
// the two run on two CUDA streams at once: whether mxtrain should run each layer's optimizer
// update on a side stream during the backward pass.
// GEMM: D[M x N] (BF16, column-major) = A[M x K] · B[N x K]^T (A, B row-major: cuBLASLt's TN),
// E4M3 x E4M3 with per-tensor scales 1 (fp8) or BF16 x BF16 (bf16), FP32 compute, 32 MiB
// workspace, the heuristic's first algorithm. A train of R back-to-back GEMMs on stream A, R
// chosen so the train lasts about 2x the plain AdamW alone.
// AdamW-like: f32 p, g, m, v of ELEMENTS each; reads p, g, m, v and writes p, m, v (28 bytes an
// element, as mxtrain's AdamW), 8 floats a thread in 16-byte accesses, 256-thread blocks, on
// stream B. Launch shapes: plain (a thread per 8 elements) and persistent (a grid-stride loop over
// S x blocks-resident-per-SM blocks: S SMs' worth; the block scheduler still places them on any
// SM with room).
// Rows: "plain" (full-device GEMMs against the plain AdamW); "plain, A high priority" (the same
// with stream A at the greatest stream priority); "split S" for S in 8, 16, 24, 33: GEMMs with
// CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = SMs - S (heuristic re-queried) against the persistent
// AdamW at S, each alone and together. Columns: the GEMM train alone, the AdamW alone, their sum,
// the concurrent wall time (common start to both done), the GEMM train's and the AdamW's own
// times within it (common start to each stream's end event), hidden = (GEMMs alone + AdamW
// alone - wall) / AdamW alone, and saved = plain serial sum (full-device GEMMs + plain AdamW,
// what runs today) - wall. Then the best row's saving per R GEMMs + one AdamW.
// Timing: every measurement enqueues its work behind a gate kernel on stream A that spins on a
// host flag, so host launch cost is not timed and both streams start together (stream B waits on
// the start event recorded after the gate). Each number: the median of 5 runs after one warm-up.
// Usage: overlap_probe [fp8|bf16 M N K ELEMENTS]
//   overlap_probe fp8 8192 3072 16384 100700000   (the default: llama-3b MLP backward GEMM, one layer)
//   overlap_probe bf16 16384 2048 5632 44000000   (llama-1b, BF16)
// Exit status 0 if it ran, 1 on any CUDA or cuBLASLt error.
// Build (not part of the CMake build; a measuring tool for the GPU machine; cudart static,
// cuBLASLt shared):
//   nvcc -std=c++20 -O2 -arch=sm_90 bench/overlap_probe.cu -o build/probe/overlap_probe -lcublasLt
// Results: bench/results/h200_overlap_probe.md.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#define CK(x)                                                                                 \
  do {                                                                                        \
    cudaError_t e_ = (x);                                                                     \
    if (e_ != cudaSuccess) {                                                                  \
      std::printf("cuda error %s in %s at line %d\n", cudaGetErrorString(e_), #x, __LINE__);  \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

#define LT(x)                                                                                         \
  do {                                                                                                \
    cublasStatus_t s_ = (x);                                                                          \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                                                \
      std::printf("cuBLASLt error %s in %s at line %d\n", cublasLtGetStatusString(s_), #x, __LINE__); \
      std::exit(1);                                                                                   \
    }                                                                                                 \
  } while (0)

namespace {

constexpr int kThreads = 256;
constexpr int kRuns = 5;
constexpr int kMaxTrain = 200;  // GEMMs a train at most
constexpr size_t kWorkspace = 32u << 20;

// ---- device kernels ----

__device__ __forceinline__ float hashed(uint64_t i, uint32_t seed) {  // in [-0.5, 0.5]
  uint32_t x = static_cast<uint32_t>(i) * 2654435761u ^ static_cast<uint32_t>(i >> 32) ^ seed;
  x ^= x >> 15;
  x *= 2246822519u;
  x ^= x >> 13;
  return static_cast<float>(x & 0xffffu) / 65535.0f - 0.5f;
}

template <typename T>
__global__ void fill(T* out, int64_t n, uint32_t seed, float scale, float offset) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x)
    out[i] = T(hashed(i, seed) * scale + offset);
}

struct Hyper {
  float lr, beta1, beta2, eps, weight_decay;
};

__device__ __forceinline__ void load8(const float* p, float (&x)[8]) {
  const float4 a = reinterpret_cast<const float4*>(p)[0], b = reinterpret_cast<const float4*>(p)[1];
  x[0] = a.x, x[1] = a.y, x[2] = a.z, x[3] = a.w, x[4] = b.x, x[5] = b.y, x[6] = b.z, x[7] = b.w;
}
__device__ __forceinline__ void store8(float* p, const float (&x)[8]) {
  reinterpret_cast<float4*>(p)[0] = make_float4(x[0], x[1], x[2], x[3]);
  reinterpret_cast<float4*>(p)[1] = make_float4(x[4], x[5], x[6], x[7]);
}

// One thread a vector of 8 elements; the grid-stride loop runs once on the plain grid.
__global__ void __launch_bounds__(kThreads) adamw(float* p, const float* g, float* m, float* v, int64_t vectors, Hyper h) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < vectors; i += stride) {
    float pi[8], gi[8], mi[8], vi[8];
    load8(p + i * 8, pi);
    load8(g + i * 8, gi);
    load8(m + i * 8, mi);
    load8(v + i * 8, vi);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      mi[j] = mi[j] + (1.0f - h.beta1) * (gi[j] - mi[j]);
      vi[j] = h.beta2 * vi[j] + (1.0f - h.beta2) * gi[j] * gi[j];
      pi[j] = pi[j] * (1.0f - h.lr * h.weight_decay) - __fdiv_rn(h.lr * mi[j], sqrtf(vi[j]) + h.eps);
    }
    store8(p + i * 8, pi);
    store8(m + i * 8, mi);
    store8(v + i * 8, vi);
  }
}

// Holds its stream until the host has enqueued everything (or ~2 s pass).
__global__ void gate(const volatile int* flag) {
  const long long begin = clock64();
  while (*flag == 0 && clock64() - begin < 4'000'000'000LL) __nanosleep(2000);
}

// ---- GEMM ----

struct Gemm {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
  float ms = 0;  // one GEMM alone
};

struct Setup {
  bool fp8;
  int64_t M, N, K, elements, vectors;
  int sms, blocks_per_sm;
  cublasLtHandle_t lt;
  void *A, *B, *D, *workspace;
  float* unit;  // device 1.0f: the FP8 scales
  float *p, *g, *m, *v;
  int* flag;         // the gate's flag, host-mapped: written by the host,
  int* flag_device;  // read by the gate here
  cudaEvent_t start, end_a, end_b;
};

enum class Made { ok, no_algorithm, target_rejected };

// The GEMM at sm_target SMs (0: the whole device); when cuBLASLt rejects the target or has no
// algorithm, says why.
Made make_gemm(const Setup& s, int sm_target, Gemm& gemm) {
  const cudaDataType_t in = s.fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  LT(cublasLtMatmulDescCreate(&gemm.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const cublasOperation_t t = CUBLAS_OP_T, n = CUBLAS_OP_N;
  LT(cublasLtMatmulDescSetAttribute(gemm.desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof t));
  LT(cublasLtMatmulDescSetAttribute(gemm.desc, CUBLASLT_MATMUL_DESC_TRANSB, &n, sizeof n));
  if (s.fp8) {
    LT(cublasLtMatmulDescSetAttribute(gemm.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &s.unit, sizeof s.unit));
    LT(cublasLtMatmulDescSetAttribute(gemm.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &s.unit, sizeof s.unit));
  }
  if (sm_target > 0) {
    const int32_t target = sm_target;
    const cublasStatus_t st = cublasLtMatmulDescSetAttribute(gemm.desc, CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET, &target, sizeof target);
    if (st != CUBLAS_STATUS_SUCCESS) {
      std::printf("cuBLASLt rejects CUBLASLT_MATMUL_DESC_SM_COUNT_TARGET = %d: %s\n", target, cublasLtGetStatusString(st));
      return Made::target_rejected;
    }
  }
  LT(cublasLtMatrixLayoutCreate(&gemm.a, in, s.K, s.M, s.K));
  LT(cublasLtMatrixLayoutCreate(&gemm.b, in, s.K, s.N, s.K));
  LT(cublasLtMatrixLayoutCreate(&gemm.d, CUDA_R_16BF, s.M, s.N, s.M));
  cublasLtMatmulPreference_t pref = nullptr;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = kWorkspace;
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace));
  cublasLtMatmulHeuristicResult_t result{};
  int returned = 0;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(s.lt, gemm.desc, gemm.a, gemm.b, gemm.d, gemm.d, pref, 1, &result, &returned);
  LT(cublasLtMatmulPreferenceDestroy(pref));
  if (st != CUBLAS_STATUS_SUCCESS || returned == 0 || result.state != CUBLAS_STATUS_SUCCESS) {
    std::printf("cuBLASLt has no algorithm for the GEMM at SM target %d: %s\n", sm_target,
                cublasLtGetStatusString(st != CUBLAS_STATUS_SUCCESS ? st : result.state));
    return Made::no_algorithm;
  }
  gemm.algo = result.algo;
  return Made::ok;
}

void destroy(Gemm& gemm) {
  if (gemm.a) cublasLtMatrixLayoutDestroy(gemm.a);
  if (gemm.b) cublasLtMatrixLayoutDestroy(gemm.b);
  if (gemm.d) cublasLtMatrixLayoutDestroy(gemm.d);
  if (gemm.desc) cublasLtMatmulDescDestroy(gemm.desc);
  gemm = Gemm{};
}

// ---- timing ----

struct Times {
  float wall = 0, a = 0, b = 0;  // ms: start to both done, to stream A's end, to stream B's end
};

// R GEMMs on stream a (none if gemm is null) and the AdamW on stream b in `blocks` blocks (none
// if 0), both released together by the gate.
Times run(const Setup& s, cudaStream_t a, cudaStream_t b, const Gemm* gemm, int R, int64_t blocks) {
  static const Hyper hyper{1e-4f, 0.9f, 0.95f, 1e-8f, 0.1f};
  *static_cast<volatile int*>(s.flag) = 0;
  gate<<<1, 1, 0, a>>>(s.flag_device);
  CK(cudaGetLastError());
  CK(cudaEventRecord(s.start, a));
  CK(cudaStreamWaitEvent(b, s.start, 0));
  const float alpha = 1.0f, beta = 0.0f;
  for (int r = 0; gemm && r < R; ++r)
    LT(cublasLtMatmul(s.lt, gemm->desc, &alpha, s.A, gemm->a, s.B, gemm->b, &beta, s.D, gemm->d, s.D, gemm->d,
                      &gemm->algo, s.workspace, kWorkspace, a));
  CK(cudaEventRecord(s.end_a, a));
  if (blocks > 0) {
    adamw<<<static_cast<unsigned>(blocks), kThreads, 0, b>>>(s.p, s.g, s.m, s.v, s.vectors, hyper);
    CK(cudaGetLastError());
  }
  CK(cudaEventRecord(s.end_b, b));
  *static_cast<volatile int*>(s.flag) = 1;
  CK(cudaStreamSynchronize(a));
  CK(cudaStreamSynchronize(b));
  Times t;
  CK(cudaEventElapsedTime(&t.a, s.start, s.end_a));
  CK(cudaEventElapsedTime(&t.b, s.start, s.end_b));
  t.wall = std::max(gemm ? t.a : 0.0f, blocks > 0 ? t.b : 0.0f);
  return t;
}

float median(std::vector<float> x) {
  std::sort(x.begin(), x.end());
  return x[x.size() / 2];
}

Times timed(const Setup& s, cudaStream_t a, cudaStream_t b, const Gemm* gemm, int R, int64_t blocks) {
  run(s, a, b, gemm, R, blocks);  // warm-up
  std::vector<float> wall, ta, tb;
  for (int i = 0; i < kRuns; ++i) {
    const Times t = run(s, a, b, gemm, R, blocks);
    wall.push_back(t.wall), ta.push_back(t.a), tb.push_back(t.b);
  }
  return {median(wall), median(ta), median(tb)};
}

struct Row {
  std::string name;
  float gemms, adamw, wall, gemm_in, adamw_in;
};

double tflops(const Setup& s, float ms) { return 2.0 * s.M * s.N * s.K / (ms * 1e-3) / 1e12; }
double gbps(const Setup& s, float ms) { return 28.0 * s.elements / (ms * 1e-3) / 1e9; }

// The GEMM train alone, the AdamW alone and both at once.
Row measure(const Setup& s, const std::string& name, cudaStream_t a, cudaStream_t b, const Gemm& gemm, int R, int64_t blocks) {
  const Times g = timed(s, a, b, &gemm, R, 0), w = timed(s, a, b, nullptr, 0, blocks), c = timed(s, a, b, &gemm, R, blocks);
  std::printf("%-24s GEMM train alone %.3f ms (%.3f ms a GEMM, %.0f TFLOP/s); AdamW alone %.3f ms (%lld blocks, %.0f GB/s)\n",
              name.c_str(), g.wall, g.wall / R, tflops(s, g.wall / R), w.wall, static_cast<long long>(blocks), gbps(s, w.wall));
  return {name, g.wall, w.wall, c.wall, c.a, c.b};
}

}  // namespace

int main(int argc, char** argv) {
  Setup s{};
  s.fp8 = true, s.M = 8192, s.N = 3072, s.K = 16384, s.elements = 100'700'000;
  if (argc == 6 && (std::strcmp(argv[1], "fp8") == 0 || std::strcmp(argv[1], "bf16") == 0)) {
    s.fp8 = std::strcmp(argv[1], "fp8") == 0;
    s.M = std::atoll(argv[2]), s.N = std::atoll(argv[3]), s.K = std::atoll(argv[4]), s.elements = std::atoll(argv[5]);
  } else if (argc != 1) {
    std::printf("usage: overlap_probe [fp8|bf16 M N K ELEMENTS]   e.g. overlap_probe fp8 8192 3072 16384 100700000\n");
    return 1;
  }
  if (s.M <= 0 || s.N <= 0 || s.K <= 0 || s.elements <= 0) {
    std::printf("M, N, K and ELEMENTS must be positive\n");
    return 1;
  }
  s.vectors = (s.elements + 7) / 8;
  const int64_t padded = s.vectors * 8;  // arrays padded to whole vectors; the rates count ELEMENTS

  int device = 0;
  CK(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CK(cudaGetDeviceProperties(&prop, device));
  s.sms = prop.multiProcessorCount;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&s.blocks_per_sm, adamw, kThreads, 0));
  LT(cublasLtCreate(&s.lt));
  std::printf("%s, %d SMs, cuBLASLt %zu; %s GEMM M=%lld N=%lld K=%lld (%.1f GFLOP); AdamW %lld elements (%.2f GB a pass), "
              "%d blocks of %d resident per SM\n",
              prop.name, s.sms, cublasLtGetVersion(), s.fp8 ? "E4M3" : "BF16", static_cast<long long>(s.M),
              static_cast<long long>(s.N), static_cast<long long>(s.K), 2.0 * s.M * s.N * s.K / 1e9,
              static_cast<long long>(s.elements), 28.0 * s.elements / 1e9, s.blocks_per_sm, kThreads);

  const size_t in_bytes = s.fp8 ? 1 : 2;
  CK(cudaMalloc(&s.A, s.M * s.K * in_bytes));
  CK(cudaMalloc(&s.B, s.N * s.K * in_bytes));
  CK(cudaMalloc(&s.D, s.M * s.N * 2));
  CK(cudaMalloc(&s.workspace, kWorkspace));
  CK(cudaMalloc(&s.unit, sizeof(float)));
  for (float** x : {&s.p, &s.g, &s.m, &s.v}) CK(cudaMalloc(x, padded * sizeof(float)));
  const float one = 1.0f;
  CK(cudaMemcpy(s.unit, &one, sizeof one, cudaMemcpyHostToDevice));
  const unsigned fill_blocks = 8u * s.sms;
  if (s.fp8) {
    fill<<<fill_blocks, kThreads>>>(static_cast<__nv_fp8_e4m3*>(s.A), s.M * s.K, 1, 0.5f, 0.0f);
    fill<<<fill_blocks, kThreads>>>(static_cast<__nv_fp8_e4m3*>(s.B), s.N * s.K, 2, 0.5f, 0.0f);
  } else {
    fill<<<fill_blocks, kThreads>>>(static_cast<__nv_bfloat16*>(s.A), s.M * s.K, 1, 0.5f, 0.0f);
    fill<<<fill_blocks, kThreads>>>(static_cast<__nv_bfloat16*>(s.B), s.N * s.K, 2, 0.5f, 0.0f);
  }
  fill<<<fill_blocks, kThreads>>>(s.p, padded, 3, 0.04f, 0.0f);
  fill<<<fill_blocks, kThreads>>>(s.g, padded, 4, 0.002f, 0.0f);
  fill<<<fill_blocks, kThreads>>>(s.m, padded, 5, 0.0002f, 0.0f);
  fill<<<fill_blocks, kThreads>>>(s.v, padded, 6, 1e-6f, 1e-6f);  // positive
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());

  CK(cudaHostAlloc(&s.flag, sizeof(int), cudaHostAllocMapped));
  CK(cudaHostGetDevicePointer(&s.flag_device, s.flag, 0));
  CK(cudaEventCreate(&s.start));
  CK(cudaEventCreate(&s.end_a));
  CK(cudaEventCreate(&s.end_b));
  int least = 0, greatest = 0;
  CK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t a, b, a_high;
  CK(cudaStreamCreateWithFlags(&a, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithFlags(&b, cudaStreamNonBlocking));
  CK(cudaStreamCreateWithPriority(&a_high, cudaStreamNonBlocking, greatest));

  Gemm full;
  if (make_gemm(s, 0, full) != Made::ok) return 1;
  const int64_t plain_blocks = (s.vectors + kThreads - 1) / kThreads;

  // R: the train lasts about 2x the plain AdamW alone.
  const Times one_gemm = timed(s, a, b, &full, 3, 0);
  full.ms = one_gemm.wall / 3;
  const Times adamw_alone = timed(s, a, b, nullptr, 0, plain_blocks);
  const int R = std::clamp(static_cast<int>(std::lround(2.0 * adamw_alone.wall / full.ms)), 1, kMaxTrain);
  std::printf("one GEMM %.3f ms (%.0f TFLOP/s), plain AdamW %.3f ms (%.0f GB/s): R = %d GEMMs a train\n\n", full.ms,
              tflops(s, full.ms), adamw_alone.wall, gbps(s, adamw_alone.wall), R);

  std::vector<Row> rows;
  rows.push_back(measure(s, "plain", a, b, full, R, plain_blocks));
  rows.push_back(measure(s, "plain, A high priority", a_high, b, full, R, plain_blocks));
  for (int S : {8, 16, 24, 33}) {
    if (S >= s.sms) continue;
    Gemm split;
    const Made made = make_gemm(s, s.sms - S, split);
    if (made != Made::ok) {
      destroy(split);
      if (made == Made::target_rejected) {
        std::printf("skipping the SM-split rows\n");
        break;
      }
      continue;
    }
    rows.push_back(measure(s, "split S=" + std::to_string(S) + " (GEMM " + std::to_string(s.sms - S) + ")", a, b, split, R,
                           static_cast<int64_t>(S) * s.blocks_per_sm));
    destroy(split);
  }

  const float baseline = rows[0].gemms + rows[0].adamw;  // today: full-device GEMMs, then the plain AdamW
  std::printf("\n| config | GEMMs alone ms | AdamW alone ms | serial sum | concurrent wall | GEMM train in concurrent | "
              "AdamW in concurrent | hidden %% | saved vs plain serial ms |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|\n");
  const Row* best = nullptr;
  for (const Row& r : rows) {
    const float serial = r.gemms + r.adamw;
    std::printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.1f | %.3f |\n", r.name.c_str(), r.gemms, r.adamw, serial,
                r.wall, r.gemm_in, r.adamw_in, 100.0f * (serial - r.wall) / r.adamw, baseline - r.wall);
    if (!best || r.wall < best->wall) best = &r;
  }
  std::printf("\nverdict: best %s saves %.3f ms per %d GEMMs + one AdamW (%.3f -> %.3f ms; %.0f%% of the plain AdamW's %.3f ms)\n",
              best->name.c_str(), baseline - best->wall, R, baseline, best->wall, 100.0f * (baseline - best->wall) / rows[0].adamw,
              rows[0].adamw);

  destroy(full);
  CK(cudaFreeHost(s.flag));
  LT(cublasLtDestroy(s.lt));
  return 0;
}
