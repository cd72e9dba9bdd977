// Shared by the attention probes (attention_plans.cpp, attention_dq_f32.cpp, attention_fp8.cpp,
// fa4_aot_probe.cpp): the CUDA check, the tensor uids, the shape and command line, the cuDNN
// handle, the buffers and inputs, the timing loop, and the BF16 training graphs as the trainer
// builds them (causal, grouped-query, attention scale 1/sqrt(D); q, k, v packed in one row of
// (H + 2 KV) * D elements, O and dO as [B, T, H, D]).
#pragma once
#include <cudnn_frontend.h>

#include <cuda_bf16.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <unordered_map>
#include <vector>

namespace fe = cudnn_frontend;

#define CK(x)                                                               \
  do {                                                                      \
    cudaError_t e_ = (x);                                                   \
    if (e_ != cudaSuccess) {                                                \
      std::printf("cuda %s at line %d\n", cudaGetErrorString(e_), __LINE__); \
      std::exit(1);                                                         \
    }                                                                       \
  } while (0)

enum : int64_t { kQ = 1, kK, kV, kO, kStats, kDO, kDQ, kDK, kDV };

struct Shape {
  int64_t B, T, H, KV, D;
};

// The forward (O and the softmax statistics) or the backward graph, tensors defined, nothing
// validated or built. fp32_dq: the backward leaves dQ in FP32 in a [B, T, H, D] buffer of its own
// instead of in the packed BF16 row.
inline std::shared_ptr<fe::graph::Graph> bf16_sdpa_graph(const Shape& s, bool backward, bool fp32_dq = false) {
  auto g = std::make_shared<fe::graph::Graph>();
  g->set_io_data_type(fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const int64_t W = (s.H + 2 * s.KV) * s.D;
  const std::vector<int64_t> qkv{s.T * W, s.D, W, 1}, o{s.T * s.H * s.D, s.D, s.H * s.D, 1};
  const std::vector<int64_t> stats_dims{s.B, s.H, s.T, 1}, stats_strides{s.H * s.T, s.T, 1, 1};
  auto t = [&](const char* n, int64_t uid, std::vector<int64_t> d, std::vector<int64_t> st) {
    return g->tensor(fe::graph::Tensor_attributes().set_name(n).set_uid(uid).set_dim(d).set_stride(st));
  };
  auto q = t("Q", kQ, {s.B, s.H, s.T, s.D}, qkv);
  auto k = t("K", kK, {s.B, s.KV, s.T, s.D}, qkv);
  auto v = t("V", kV, {s.B, s.KV, s.T, s.D}, qkv);
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  if (!backward) {
    auto [out, stats] = g->sdpa(
        q, k, v, fe::graph::SDPA_attributes().set_name("f").set_generate_stats(true).set_causal_mask(true).set_attn_scale(scale));
    out->set_output(true).set_dim({s.B, s.H, s.T, s.D}).set_stride(o).set_uid(kO);
    stats->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim(stats_dims).set_stride(stats_strides).set_uid(kStats);
    return g;
  }
  auto out = t("O", kO, {s.B, s.H, s.T, s.D}, o);
  auto dout = t("dO", kDO, {s.B, s.H, s.T, s.D}, o);
  auto stats = g->tensor(fe::graph::Tensor_attributes().set_name("S").set_uid(kStats).set_dim(stats_dims)
                             .set_stride(stats_strides).set_data_type(fe::DataType_t::FLOAT));
  auto [dq, dk, dv] = g->sdpa_backward(
      q, k, v, out, dout, stats, fe::graph::SDPA_backward_attributes().set_name("b").set_causal_mask(true).set_attn_scale(scale));
  if (fp32_dq) {
    dq->set_output(true).set_data_type(fe::DataType_t::FLOAT).set_dim({s.B, s.H, s.T, s.D}).set_stride(o).set_uid(kDQ);
  } else {
    dq->set_output(true).set_dim({s.B, s.H, s.T, s.D}).set_stride(qkv).set_uid(kDQ);
  }
  dk->set_output(true).set_dim({s.B, s.KV, s.T, s.D}).set_stride(qkv).set_uid(kDK);
  dv->set_output(true).set_dim({s.B, s.KV, s.T, s.D}).set_stride(qkv).set_uid(kDV);
  return g;
}

// The probes' command line, "NAME B T H KV D": the shape, and the output's first line naming it
// and cuDNN's version; false (after printing the usage) when it is short.
inline bool parse_shape(int argc, char** argv, const char* name, Shape* s) {
  if (argc < 6) {
    std::printf("usage: %s B T H KV D\n", name);
    return false;
  }
  *s = Shape{std::atoll(argv[1]), std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), std::atoll(argv[5])};
  std::printf("# %s B=%lld T=%lld H=%lld KV=%lld D=%lld causal; cuDNN %zu\n", name, (long long)s->B, (long long)s->T,
              (long long)s->H, (long long)s->KV, (long long)s->D, cudnnGetVersion());
  return true;
}

// A cuDNN handle working on a stream of its own.
struct CudnnOnStream {
  cudnnHandle_t handle = nullptr;
  cudaStream_t stream = nullptr;
};
inline CudnnOnStream cudnn_on_stream() {
  CudnnOnStream c;
  if (cudnnCreate(&c.handle) != CUDNN_STATUS_SUCCESS) {
    std::printf("cudnnCreate failed\n");
    std::exit(1);
  }
  CK(cudaStreamCreate(&c.stream));
  cudnnSetStream(c.handle, c.stream);
  return c;
}

// One attention call's buffers as the trainer lays them out: q|k|v packed in rows of
// (H + 2 KV) * D elements, O and dO [B, T, H, D], the statistics [B, H, T] in f32, dq|dk|dv packed
// like q|k|v. BF16 throughout but the statistics.
struct ProbeBuffers {
  void *qkv = nullptr, *o = nullptr, *stats = nullptr, *dout = nullptr, *dqkv = nullptr;
};

inline ProbeBuffers allocate_probe_buffers(const Shape& s) {
  const int64_t rows = s.B * s.T, W = (s.H + 2 * s.KV) * s.D;
  ProbeBuffers b;
  CK(cudaMalloc(&b.qkv, rows * W * 2));
  CK(cudaMalloc(&b.dqkv, rows * W * 2));
  CK(cudaMalloc(&b.o, rows * s.H * s.D * 2));
  CK(cudaMalloc(&b.dout, rows * s.H * s.D * 2));
  CK(cudaMalloc(&b.stats, s.B * s.H * s.T * 4));
  return b;
}

// Q, K, V and dO ~ U(-1, 1) in BF16 from one fixed-seed generator (the same values in every probe).
inline void fill_probe_inputs(const Shape& s, const ProbeBuffers& b) {
  const int64_t rows = s.B * s.T, W = (s.H + 2 * s.KV) * s.D;
  std::vector<__nv_bfloat16> host(rows * W);
  uint32_t state = 12345;
  auto uniform = [&] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 8388608.0f - 1.0f;
  };
  for (auto& x : host) x = __float2bfloat16(uniform());
  CK(cudaMemcpy(b.qkv, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
  host.resize(rows * s.H * s.D);
  for (auto& x : host) x = __float2bfloat16(uniform());
  CK(cudaMemcpy(b.dout, host.data(), host.size() * 2, cudaMemcpyHostToDevice));
}

// The graphs' tensors in those buffers, by uid.
inline std::unordered_map<int64_t, void*> probe_pack(const Shape& s, const ProbeBuffers& b) {
  char* base = static_cast<char*>(b.qkv);
  char* grad = static_cast<char*>(b.dqkv);
  const int64_t k = s.H * s.D * 2, v = (s.H + s.KV) * s.D * 2;
  return {{kQ, base},        {kK, base + k}, {kV, base + v},    {kO, b.o},        {kStats, b.stats},
          {kDO, b.dout},     {kDQ, grad},    {kDK, grad + k},   {kDV, grad + v}};
}

// The least over 5 rounds of the mean time of `runs` calls of run() on `stream`, in ms.
template <typename Run>
float min_of_rounds_ms(cudaStream_t stream, int runs, Run&& run) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  float best = 1e9f;
  for (int round = 0; round < 5; ++round) {
    CK(cudaEventRecord(a, stream));
    for (int r = 0; r < runs; ++r) run();
    CK(cudaEventRecord(b, stream));
    CK(cudaEventSynchronize(b));
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, a, b));
    best = std::min(best, ms / runs);
  }
  CK(cudaEventDestroy(a));
  CK(cudaEventDestroy(b));
  return best;
}
