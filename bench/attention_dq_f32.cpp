// Can cuDNN's SDPA backward leave dQ in FP32 (its accumulator) while Q, K, V, O, dO, dK, dV stay
// BF16? If so, the trainer could skip cuDNN's dQ convert kernel and let its own RoPE-backward cast
// read the FP32 dQ. Builds the training graphs at one shape (causal, grouped-query, the packed
// qkv layout the trainer uses; dQ FP32 in a [B, T, H, D] buffer of its own), says whether cuDNN
// takes the FP32 dQ, times both backward graphs (minimum of 5 rounds of 4 runs) and compares the
// two dQs (max |difference| and the BF16 dQ's max |value|).
// Usage: attention_dq_f32 B T H KV D   (llama-1b: 8 2048 32 4 64)
// Build (a measuring tool for the GPU machine, not part of the CMake build):
//   nvcc -std=c++20 -O2 -x cu bench/attention_dq_f32.cpp -o build/attention_dq_f32 \
//        -I<cudnn-frontend include> -L<cudnn lib> -l:libcudnn.so.9 -L<nvrtc lib> -l:libnvrtc.so.<N> -lcuda -ldl
// Results: bench/results/h200_attention_dq_f32.md.
#include <cuda_bf16.h>
#include "sdpa_probe.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

// The forward (fp32_dq ignored) or the backward graph, validated and built; null with cuDNN's
// message if it is refused.
std::shared_ptr<fe::graph::Graph> make_graph(const Shape& s, bool backward, bool fp32_dq, cudnnHandle_t handle,
                                             std::string* refusal) {
  auto g = bf16_sdpa_graph(s, backward, fp32_dq);
  auto refuse = [&](const char* step, fe::error_t e) {
    *refusal = std::string(step) + ": " + e.get_message();
    return nullptr;
  };
  if (auto e = g->validate(); !e.is_good()) return refuse("validate", e);
  if (auto e = g->build_operation_graph(handle); !e.is_good()) return refuse("build_operation_graph", e);
  if (auto e = g->create_execution_plans({fe::HeurMode_t::A}); !e.is_good()) return refuse("create_execution_plans", e);
  if (auto e = g->check_support(handle); !e.is_good()) return refuse("check_support", e);
  if (auto e = g->build_plans(handle); !e.is_good()) return refuse("build_plans", e);
  return g;
}

int main(int argc, char** argv) {
  Shape s;
  if (!parse_shape(argc, argv, "attention_dq_f32", &s)) return 2;
  const CudnnOnStream cudnn = cudnn_on_stream();
  cudnnHandle_t handle = cudnn.handle;
  cudaStream_t stream = cudnn.stream;
  const int64_t W = (s.H + 2 * s.KV) * s.D, rows = s.B * s.T, q_elems = rows * s.H * s.D;
  const ProbeBuffers buffers = allocate_probe_buffers(s);
  void *dq32, *ws;
  CK(cudaMalloc(&dq32, q_elems * 4));
  const size_t ws_bytes = size_t(1) << 30;
  CK(cudaMalloc(&ws, ws_bytes));
  fill_probe_inputs(s, buffers);
  void* dqkv = buffers.dqkv;
  std::unordered_map<int64_t, void*> pack = probe_pack(s, buffers);
  std::string refusal;
  auto forward = make_graph(s, false, false, handle, &refusal);
  if (!forward) {
    std::printf("forward refused: %s\n", refusal.c_str());
    return 1;
  }
  if (!forward->execute(handle, pack, ws).is_good()) return 1;
  CK(cudaStreamSynchronize(stream));
  auto time_graph = [&](fe::graph::Graph& g, std::unordered_map<int64_t, void*>& p) -> float {
    int64_t need = 0;
    (void)g.get_workspace_size_plan_at_index(0, need);
    if (need > static_cast<int64_t>(ws_bytes) || !g.execute(handle, p, ws).is_good()) return -1;
    CK(cudaStreamSynchronize(stream));
    return min_of_rounds_ms(stream, 4, [&] { (void)g.execute(handle, p, ws); });
  };
  auto bf16_graph = make_graph(s, true, false, handle, &refusal);
  if (!bf16_graph) {
    std::printf("bf16 dQ backward refused: %s\n", refusal.c_str());
    return 1;
  }
  const float bf16_ms = time_graph(*bf16_graph, pack);
  std::printf("backward, bf16 dQ (packed with dK, dV): %.4f ms\n", bf16_ms);
  std::vector<__nv_bfloat16> dq_bf16(rows * W);
  CK(cudaMemcpy(dq_bf16.data(), dqkv, dq_bf16.size() * 2, cudaMemcpyDeviceToHost));
  auto f32_graph = make_graph(s, true, true, handle, &refusal);
  if (!f32_graph) {
    std::printf("backward, fp32 dQ: refused (%s)\n", refusal.c_str());
    return 0;
  }
  auto pack32 = pack;
  pack32[kDQ] = dq32;
  const float f32_ms = time_graph(*f32_graph, pack32);
  std::printf("backward, fp32 dQ ([B, T, H, D] of its own): %.4f ms\n", f32_ms);
  std::vector<float> dq_f32(q_elems);
  CK(cudaMemcpy(dq_f32.data(), dq32, dq_f32.size() * 4, cudaMemcpyDeviceToHost));
  double max_diff = 0, max_value = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < s.H * s.D; ++c) {
      const double x = __bfloat162float(dq_bf16[r * W + c]), y = dq_f32[r * s.H * s.D + c];
      max_diff = std::max(max_diff, std::fabs(x - y));
      max_value = std::max(max_value, std::fabs(x));
    }
  std::printf("dQ: max |bf16 - fp32| %.3e, max |bf16 dQ| %.3e\n", max_diff, max_value);
  return 0;
}
