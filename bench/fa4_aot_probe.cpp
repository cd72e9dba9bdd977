// Can C++ call FlashAttention-4's Hopper kernels, compiled ahead of time without Python at run
// time, and are they as fast there as from PyTorch? bench/fa4_export.py compiles them (on a machine
// without a GPU) and exports each as an object file holding a TVM-FFI packed function; this probe
// links those objects, the CuTe DSL's static CUDA runtime shim and libtvm_ffi (PyPI
// apache-tvm-ffi), runs forward and backward on the trainer's packed q|k|v rows beside cuDNN's
// graphs (sdpa_probe.hpp), and prints the relative L2 difference of O, dQ, dK, dV and the times;
// then FlashAttention-4's backward from cuDNN's forward (its O and statistics), the pairing a
// trainer would use where cuDNN's forward is the faster one.
//
// Built and run by bench/flash_attn4.sh (aot here, with g++: there is no device code; probe on
// the GPU machine). Usage: fa4_aot_probe B T H KV D   Results: bench/results/h200_attention_libraries.md.
#include <cuda_bf16.h>
#include <tvm/ffi/extra/c_env_api.h>

#include <string>
#include <unordered_map>

#include "mxtrain/backend/cuda/tvm_ffi_call.hpp"  // the trainer's calls: views, values, the DSL's error hook
#include "sdpa_probe.hpp"

extern "C" {
int __tvm_ffi_mxtrain_fa4_fwd(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
int __tvm_ffi_mxtrain_fa4_bwd_pre(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
int __tvm_ffi_mxtrain_fa4_bwd(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
int __tvm_ffi_mxtrain_fa4_bwd_post_dq(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
// Only with grouped-query heads (multi-head attention writes dK and dV in the main kernel).
__attribute__((weak)) int __tvm_ffi_mxtrain_fa4_bwd_post_dkv(void*, const TVMFFIAny*, int32_t, TVMFFIAny*);
}

namespace {

using mxtrain::tvm_ffi::kBf16;
using mxtrain::tvm_ffi::kF32;
using mxtrain::tvm_ffi::none;
using mxtrain::tvm_ffi::Packed;
using mxtrain::tvm_ffi::real;
using mxtrain::tvm_ffi::View;

void call(const char* name, Packed fn, std::initializer_list<TVMFFIAny> args) {
  const std::string error = mxtrain::tvm_ffi::call(fn, args);
  if (error.empty()) return;
  std::printf("%s failed: %s\n", name, error.c_str());
  std::exit(1);
}

// ||a - b|| / ||b|| over `cols` columns from `first` of `rows` rows `stride` elements apart.
double rel_l2(const std::vector<__nv_bfloat16>& a, const std::vector<__nv_bfloat16>& b, int64_t rows, int64_t stride,
              int64_t first, int64_t cols) {
  double num = 0, den = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = first; c < first + cols; ++c) {
      const double x = __bfloat162float(a[r * stride + c]), y = __bfloat162float(b[r * stride + c]);
      num += (x - y) * (x - y);
      den += y * y;
    }
  return std::sqrt(num / std::max(den, 1e-30));
}

}  // namespace

int main(int argc, char** argv) {
  Shape s;
  if (!parse_shape(argc, argv, "fa4_aot_probe", &s)) return 2;
  const CudnnOnStream cudnn = cudnn_on_stream();
  cudnnHandle_t handle = cudnn.handle;
  cudaStream_t stream = cudnn.stream;
  if (TVMFFIEnvSetStream(kDLCUDA, 0, stream, nullptr) != 0) return 1;

  const int64_t W = (s.H + 2 * s.KV) * s.D, rows = s.B * s.T, q_elems = rows * s.H * s.D;
  // FlashAttention-4's workspaces for the Hopper backward, as flash_attn/cute/interface.py
  // allocates them: rows rounded to its causal tiles (_tile_size_bwd_sm90: 128 query and 128 key
  // rows up to D 64, 64 and 128 up to D 128), the head dimension to 32.
  if (s.D > 128) {
    std::printf("this probe covers head dimensions up to 128\n");
    return 2;
  }
  const bool grouped = s.H != s.KV;
  if (grouped && __tvm_ffi_mxtrain_fa4_bwd_post_dkv == nullptr) {
    std::printf("grouped-query heads, but no dK/dV postprocess was exported (export at this shape)\n");
    return 2;
  }
  const int64_t m_tile = s.D <= 64 ? 128 : 64, n_tile = 128;
  const int64_t Tq = (s.T + m_tile - 1) / m_tile * m_tile, Tk = (s.T + n_tile - 1) / n_tile * n_tile,
                Dr = (s.D + 31) / 32 * 32;
  // cuDNN's buffers (sdpa_probe.hpp) and FlashAttention-4's own O, LSE, gradients and workspaces.
  const ProbeBuffers ref = allocate_probe_buffers(s);
  void *o_fa, *lse, *dqkv_fa, *ws, *dpsum, *lse_log2, *dq_accum, *dk_accum, *dv_accum;
  CK(cudaMalloc(&dqkv_fa, rows * W * 2));
  CK(cudaMalloc(&o_fa, q_elems * 2));
  CK(cudaMalloc(&lse, s.B * s.H * s.T * 4));
  CK(cudaMalloc(&dpsum, s.B * s.H * Tq * 4));
  CK(cudaMalloc(&lse_log2, s.B * s.H * Tq * 4));
  CK(cudaMalloc(&dq_accum, s.B * s.H * Tq * Dr * 4));
  CK(cudaMalloc(&dk_accum, s.B * s.KV * Tk * Dr * 4));
  CK(cudaMalloc(&dv_accum, s.B * s.KV * Tk * Dr * 4));
  const size_t ws_bytes = size_t(1) << 30;
  CK(cudaMalloc(&ws, ws_bytes));
  fill_probe_inputs(s, ref);  // the other probes' inputs

  // cuDNN, as the trainer runs it.
  void *o_ref = ref.o, *stats = ref.stats, *dout = ref.dout, *dqkv_ref = ref.dqkv;
  char* base = static_cast<char*>(ref.qkv);
  std::unordered_map<int64_t, void*> pack = probe_pack(s, ref);
  auto build = [&](bool backward) {
    auto g = bf16_sdpa_graph(s, backward);
    if (!g->validate().is_good() || !g->build_operation_graph(handle).is_good() ||
        !g->create_execution_plans({fe::HeurMode_t::A}).is_good() || !g->check_support(handle).is_good() ||
        !g->build_plans(handle).is_good()) {
      std::printf("cuDNN refused the %s graph\n", backward ? "backward" : "forward");
      std::exit(1);
    }
    return g;
  };
  auto forward = build(false), backward = build(true);
  auto run_cudnn = [&](fe::graph::Graph& g) {
    if (!g.execute(handle, pack, ws).is_good()) {
      std::printf("cuDNN execute failed\n");
      std::exit(1);
    }
  };

  // FlashAttention-4 on the same packed rows: q, k, v as strided [B, T, heads, D] views.
  const float scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  View q(base, kBf16, 0, {s.B, s.T, s.H, s.D}, {s.T * W, W, s.D, 1});
  View k(base + s.H * s.D * 2, kBf16, 0, {s.B, s.T, s.KV, s.D}, {s.T * W, W, s.D, 1});
  View v(base + (s.H + s.KV) * s.D * 2, kBf16, 0, {s.B, s.T, s.KV, s.D}, {s.T * W, W, s.D, 1});
  char* fgrad = static_cast<char*>(dqkv_fa);
  View dq(fgrad, kBf16, 0, {s.B, s.T, s.H, s.D}, {s.T * W, W, s.D, 1});
  View dk(fgrad + s.H * s.D * 2, kBf16, 0, {s.B, s.T, s.KV, s.D}, {s.T * W, W, s.D, 1});
  View dv(fgrad + (s.H + s.KV) * s.D * 2, kBf16, 0, {s.B, s.T, s.KV, s.D}, {s.T * W, W, s.D, 1});
  View o(o_fa, kBf16, 0, {s.B, s.T, s.H, s.D}, {s.T * s.H * s.D, s.H * s.D, s.D, 1});
  View d_o(dout, kBf16, 0, {s.B, s.T, s.H, s.D}, {s.T * s.H * s.D, s.H * s.D, s.D, 1});
  View l(lse, kF32, 0, {s.B, s.H, s.T}, {s.H * s.T, s.T, 1});
  View l2(lse_log2, kF32, 0, {s.B, s.H, Tq}, {s.H * Tq, Tq, 1});
  View dp(dpsum, kF32, 0, {s.B, s.H, Tq}, {s.H * Tq, Tq, 1});
  View dqa(dq_accum, kF32, 0, {s.B, s.H, Tq * Dr}, {s.H * Tq * Dr, Tq * Dr, 1});
  View dka(dk_accum, kF32, 0, {s.B, s.KV, Tk * Dr}, {s.KV * Tk * Dr, Tk * Dr, 1});
  View dva(dv_accum, kF32, 0, {s.B, s.KV, Tk * Dr}, {s.KV * Tk * Dr, Tk * Dr, 1});
  // The (None, None) aux-data tuple the compiled functions take, as an ffi.Array.
  TVMFFIAny pair;
  if (const std::string error = mxtrain::tvm_ffi::make_none_pair(&pair); !error.empty()) {
    std::printf("ffi.Array failed: %s\n", error.c_str());
    return 1;
  }
  const TVMFFIAny n = none();
  auto fa_forward = [&] {
    call("forward", __tvm_ffi_mxtrain_fa4_fwd,
         {q.any(), k.any(), v.any(), o.any(), l.any(), real(scale), n, n, n, n, n, n, n, n, n, pair, n, n});
  };
  // Grouped-query heads: dK and dV summed over each group's query heads in zeroed FP32
  // accumulators, then written in BF16 by a postprocess; multi-head: the main kernel writes them.
  auto fa_backward = [&] {
    if (grouped) {
      CK(cudaMemsetAsync(dk_accum, 0, s.B * s.KV * Tk * Dr * 4, stream));
      CK(cudaMemsetAsync(dv_accum, 0, s.B * s.KV * Tk * Dr * 4, stream));
    }
    call("backward preprocess", __tvm_ffi_mxtrain_fa4_bwd_pre,
         {o.any(), d_o.any(), dp.any(), l.any(), l2.any(), dqa.any(), n, n, n, n, n, real(1.0), n, n});
    call("backward", __tvm_ffi_mxtrain_fa4_bwd,
         {q.any(), k.any(), v.any(), d_o.any(), l2.any(), dp.any(), dqa.any(),
          grouped ? dka.any() : dk.any(), grouped ? dva.any() : dv.any(), real(scale), n, n, n, n, n, n, n, n,
          n, pair, n, n});
    call("dQ postprocess", __tvm_ffi_mxtrain_fa4_bwd_post_dq, {dqa.any(), dq.any(), real(scale), n, n, n, n});
    if (grouped) {
      call("dK postprocess", __tvm_ffi_mxtrain_fa4_bwd_post_dkv, {dka.any(), dk.any(), real(scale), n, n, n, n});
      call("dV postprocess", __tvm_ffi_mxtrain_fa4_bwd_post_dkv, {dva.any(), dv.any(), real(1.0), n, n, n, n});
    }
  };

  // Correctness: each library's O from its own forward; the backward from cuDNN's O and
  // statistics for cuDNN, from FlashAttention-4's O and LSE for it, the same dO.
  run_cudnn(*forward);
  run_cudnn(*backward);
  fa_forward();
  fa_backward();
  CK(cudaStreamSynchronize(stream));
  std::vector<__nv_bfloat16> a(q_elems), b(q_elems);
  CK(cudaMemcpy(a.data(), o_fa, q_elems * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), o_ref, q_elems * 2, cudaMemcpyDeviceToHost));
  const double err_o = rel_l2(a, b, rows, s.H * s.D, 0, s.H * s.D);
  a.resize(rows * W);
  b.resize(rows * W);
  CK(cudaMemcpy(a.data(), dqkv_fa, rows * W * 2, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(b.data(), dqkv_ref, rows * W * 2, cudaMemcpyDeviceToHost));
  auto part = [&](int64_t first_head, int64_t heads) { return rel_l2(a, b, rows, W, first_head * s.D, heads * s.D); };
  std::printf("relative L2 difference from cuDNN: O %.2e dQ %.2e dK %.2e dV %.2e\n", err_o, part(0, s.H),
              part(s.H, s.KV), part(s.H + s.KV, s.KV));
  // FlashAttention-4's backward from cuDNN's forward: its O and its statistics (natural-log LSE,
  // [B, H, T]) in place of FlashAttention-4's own.
  o.t.data = o_ref;
  l.t.data = stats;
  fa_backward();
  CK(cudaStreamSynchronize(stream));
  CK(cudaMemcpy(a.data(), dqkv_fa, rows * W * 2, cudaMemcpyDeviceToHost));
  std::printf("FA4 backward from cuDNN's forward, relative L2 difference from cuDNN's backward: dQ %.2e dK %.2e dV %.2e\n",
              part(0, s.H), part(s.H, s.KV), part(s.H + s.KV, s.KV));

  const double flops_fwd = 4.0 * s.B * s.T * s.T * s.H * s.D / 2;  // causal
  const float cudnn_fwd = min_of_rounds_ms(stream, 10, [&] { run_cudnn(*forward); });
  const float cudnn_bwd = min_of_rounds_ms(stream, 10, [&] { run_cudnn(*backward); });
  const float fa_fwd = min_of_rounds_ms(stream, 10, fa_forward);
  const float fa_bwd = min_of_rounds_ms(stream, 10, fa_backward);  // from cuDNN's O and statistics
  auto rate = [&](double flops, float ms) { return flops / ms / 1e9; };
  std::printf("pass       cuDNN ms  TFLOP/s   FA4 ms  TFLOP/s   cuDNN / FA4\n");
  std::printf("forward   %9.4f %8.0f %8.4f %8.0f %10.3fx\n", cudnn_fwd, rate(flops_fwd, cudnn_fwd), fa_fwd,
              rate(flops_fwd, fa_fwd), cudnn_fwd / fa_fwd);
  std::printf("backward  %9.4f %8.0f %8.4f %8.0f %10.3fx\n", cudnn_bwd, rate(2.5 * flops_fwd, cudnn_bwd), fa_bwd,
              rate(2.5 * flops_fwd, fa_bwd), cudnn_bwd / fa_bwd);
  return 0;
}
