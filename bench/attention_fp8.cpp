// cuDNN FP8 scaled-dot-product attention against cuDNN BF16 attention at one training shape:
// causal, grouped-query (KV key/value heads), attention scale 1/sqrt(D), forward with softmax
// stats (training forward) and backward. Rows: BF16 forward and backward; FP8 forward (E4M3 Q, K,
// V, O; stats and amax outputs); FP8 backward with dO in E4M3 (dQ, dK, dV in E4M3), with dO in
// E5M2 (dQ, dK, dV in E5M2, Transformer Engine's "hybrid" format) and with dO in E4M3 but BF16
// dQ, dK, dV. Each row: the minimum over 5 rounds of 10 runs (after 3 warm-up runs) in ms, and
// TFLOP/s counting causal FLOPs (forward 2*B*H*T^2*D, backward 2.5x that); then the speedups
// (BF16 ms / FP8 ms) for forward, backward and both. A row whose graph cuDNN refuses prints
// cuDNN's message and the rest go on. If an FP8 graph refuses KV < H, it is retried with K and
// V expanded to H heads (said so in the output), and BF16 is then timed that way too.
// Sanity check before timing: Q, K, V, dO ~ N(0,1) (fixed seed); relative L2 error of FP8 O,
// dQ, dK, dV (dequantized on the host) against the BF16 graphs' outputs, once with every scale
// 1 and once with per-tensor power-of-two scales from the graphs' own amax outputs (at scale 1
// the small probabilities P and the small dS underflow E4M3, so only the second is the accuracy
// FP8 attention would have in training); the amax outputs are printed too.
// Memory: Q, K, V, O, dO, dQ, dK, dV are separate [B, T, heads, D] (BSHD) tensors presented to
// cuDNN as dims {B, heads, T, D} with BSHD strides; the trainer packs q, k, v of a token in one
// row (a larger row stride), which this tool does not.
// Usage: attention_fp8 B T H KV D   (llama-1b: 8 2048 32 4 64; llama-3b: 4 2048 24 8 128)
// Exit status 0 if the BF16 rows ran, 1 otherwise.
// Build (not part of the CMake build; a measuring tool for the GPU machine):
//   nvcc -std=c++20 -O2 -x cu bench/attention_fp8.cpp -o build/attention_fp8 -I<cudnn-frontend include> -lcudnn -lnvrtc -lcuda
// Results: bench/results/h200_attention_fp8.md.
#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include "sdpa_probe.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

using DT = fe::DataType_t;
using GraphPtr = std::shared_ptr<fe::graph::Graph>;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

// Tensor uids past sdpa_probe.hpp's (kQ .. kDV); the per-tensor scales and amaxes live in one
// device float array indexed by uid.
enum : int64_t {
  kDescQ = kDV + 1, kDescK, kDescV, kDescO, kDescDO, kDescS, kDescDP,
  kScaleS, kScaleO, kScaleDQ, kScaleDK, kScaleDV, kScaleDP,
  kAmaxS, kAmaxO, kAmaxDQ, kAmaxDK, kAmaxDV, kAmaxDP, kUids
};
using Scalars = std::array<float, kUids>;

struct Variant {
  std::string name;
  bool fp8, bwd;
  DT dO = DT::BFLOAT16, dqkv = DT::BFLOAT16;  // FP8 backward: dO and dQ/dK/dV types
};

float fp8_max(DT t) { return t == DT::FP8_E4M3 ? 448.0f : t == DT::FP8_E5M2 ? 57344.0f : 0.0f; }

// Largest power of two s with amax * s <= max: a per-tensor scale with headroom below 2x.
float pow2_scale(float amax, float max) {
  if (max == 0.0f || !(amax > 0.0f) || !std::isfinite(amax)) return 1.0f;
  return std::exp2(std::floor(std::log2(max / amax)));
}

GraphPtr build(const Shape& s, int64_t kv, const Variant& v, cudnnHandle_t handle, std::string& why) {
  namespace gr = fe::graph;
  auto g = std::make_shared<gr::Graph>();
  const DT io = v.fp8 ? DT::FP8_E4M3 : DT::BFLOAT16;
  g->set_io_data_type(io).set_intermediate_data_type(DT::FLOAT).set_compute_data_type(DT::FLOAT);
  auto dims = [&](int64_t n) { return std::vector<int64_t>{s.B, n, s.T, s.D}; };
  auto bshd = [&](int64_t n) { return std::vector<int64_t>{s.T * n * s.D, s.D, n * s.D, 1}; };
  auto in = [&](const char* name, int64_t uid, int64_t n, DT t) {
    return g->tensor(gr::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims(n)).set_stride(bshd(n)).set_data_type(t));
  };
  auto out = [&](const TensorPtr& t, int64_t uid, int64_t n, DT type) {
    t->set_output(true).set_uid(uid).set_dim(dims(n)).set_stride(bshd(n)).set_data_type(type);
  };
  auto scalar = [&](const char* name, int64_t uid) {
    return g->tensor(gr::Tensor_attributes().set_name(name).set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(DT::FLOAT));
  };
  auto scalar_out = [&](const TensorPtr& t, int64_t uid) {
    t->set_output(true).set_uid(uid).set_dim({1, 1, 1, 1}).set_stride({1, 1, 1, 1}).set_data_type(DT::FLOAT);
  };
  const std::vector<int64_t> stats_dim{s.B, s.H, s.T, 1}, stats_stride{s.H * s.T, s.T, 1, 1};
  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(s.D));
  try {
    auto q = in("Q", kQ, s.H, io), k = in("K", kK, kv, io), vv = in("V", kV, kv, io);
    if (!v.bwd) {
      auto opts = gr::SDPA_attributes().set_name("f").set_generate_stats(true).set_causal_mask(true).set_attn_scale(attn_scale);
      TensorPtr o, stats;
      if (!v.fp8) {
        auto r = g->sdpa(q, k, vv, opts);
        o = r[0], stats = r[1];
      } else {
        auto [o8, stats8, amax_s, amax_o] =
            g->sdpa_fp8(q, k, vv, scalar("descale_Q", kDescQ), scalar("descale_K", kDescK), scalar("descale_V", kDescV),
                        scalar("descale_S", kDescS), scalar("scale_S", kScaleS), scalar("scale_O", kScaleO), opts);
        o = o8;
        stats = stats8;
        scalar_out(amax_s, kAmaxS);
        scalar_out(amax_o, kAmaxO);
      }
      out(o, kO, s.H, io);
      stats->set_output(true).set_uid(kStats).set_dim(stats_dim).set_stride(stats_stride).set_data_type(DT::FLOAT);
    } else {
      auto o = in("O", kO, s.H, io);
      auto dout = in("dO", kDO, s.H, v.fp8 ? v.dO : io);
      auto stats = g->tensor(gr::Tensor_attributes().set_name("Stats").set_uid(kStats).set_dim(stats_dim).set_stride(stats_stride).set_data_type(DT::FLOAT));
      TensorPtr dq, dk, dv;
      if (!v.fp8) {
        auto r = g->sdpa_backward(q, k, vv, o, dout, stats,
                                  gr::SDPA_backward_attributes().set_name("b").set_causal_mask(true).set_attn_scale(attn_scale));
        dq = r[0], dk = r[1], dv = r[2];
      } else {
        auto r = g->sdpa_fp8_backward(
            q, k, vv, o, dout, stats, scalar("descale_Q", kDescQ), scalar("descale_K", kDescK),
            scalar("descale_V", kDescV), scalar("descale_O", kDescO), scalar("descale_dO", kDescDO),
            scalar("descale_S", kDescS), scalar("descale_dP", kDescDP), scalar("scale_S", kScaleS),
            scalar("scale_dQ", kScaleDQ), scalar("scale_dK", kScaleDK), scalar("scale_dV", kScaleDV),
            scalar("scale_dP", kScaleDP),
            gr::SDPA_fp8_backward_attributes().set_name("b").set_causal_mask(true).set_attn_scale(attn_scale));
        dq = r[0], dk = r[1], dv = r[2];
        scalar_out(r[3], kAmaxDQ);
        scalar_out(r[4], kAmaxDK);
        scalar_out(r[5], kAmaxDV);
        scalar_out(r[6], kAmaxDP);
      }
      const DT grad = v.fp8 ? v.dqkv : io;
      out(dq, kDQ, s.H, grad);
      out(dk, kDK, kv, grad);
      out(dv, kDV, kv, grad);
    }
    auto step = [&](fe::error_t e, const char* what) {
      if (e.is_good()) return true;
      why = std::string(what) + ": " + e.get_message();
      return false;
    };
    if (!step(g->validate(), "validate") || !step(g->build_operation_graph(handle), "build_operation_graph") ||
        !step(g->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans") ||
        !step(g->check_support(handle), "check_support") || !step(g->build_plans(handle), "build_plans"))
      return nullptr;
  } catch (const std::exception& e) {
    why = std::string("exception: ") + e.what();
    return nullptr;
  }
  return g;
}

// Host data: fixed-seed N(0,1) (splitmix64 + Box-Muller), conversions, comparisons.
struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  double uniform() { return (static_cast<double>(next() >> 11) + 0.5) * 0x1.0p-53; }
};

std::vector<float> normal(size_t n, Rng& r) {
  std::vector<float> x(n);
  for (size_t i = 0; i < n; i += 2) {
    const double m = std::sqrt(-2.0 * std::log(r.uniform())), a = 6.283185307179586 * r.uniform();
    x[i] = static_cast<float>(m * std::cos(a));
    if (i + 1 < n) x[i + 1] = static_cast<float>(m * std::sin(a));
  }
  return x;
}

template <class T>
void* upload(const std::vector<float>& x, float scale = 1.0f) {
  std::vector<T> h(x.size());
  for (size_t i = 0; i < x.size(); ++i) h[i] = T(x[i] * scale);
  void* d;
  CK(cudaMalloc(&d, h.size() * sizeof(T)));
  CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

template <class T>
std::vector<float> download_as(const void* d, size_t n, float mul) {
  std::vector<T> h(n);
  CK(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
  std::vector<float> x(n);
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(h[i]) * mul;
  return x;
}

std::vector<float> download(const void* d, size_t n, DT t, float mul = 1.0f) {
  if (t == DT::FP8_E4M3) return download_as<__nv_fp8_e4m3>(d, n, mul);
  if (t == DT::FP8_E5M2) return download_as<__nv_fp8_e5m2>(d, n, mul);
  if (t == DT::BFLOAT16) return download_as<__nv_bfloat16>(d, n, mul);
  return download_as<float>(d, n, mul);
}

double rel_l2(const std::vector<float>& x, const std::vector<float>& ref) {
  if (x.size() != ref.size() || ref.empty()) return NAN;
  double num = 0, den = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double d = static_cast<double>(x[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return std::sqrt(num / den);
}

float max_abs(const std::vector<float>& x) {
  float m = 0;
  for (float v : x) m = std::max(m, std::fabs(v));
  return m;
}

// [B, T, KV, D] -> [B, T, H, D]: each query head gets its group's key/value head.
std::vector<float> expand(const std::vector<float>& x, const Shape& s) {
  std::vector<float> y(static_cast<size_t>(s.B * s.T * s.H * s.D));
  const int64_t g = s.H / s.KV;
  for (int64_t bt = 0; bt < s.B * s.T; ++bt)
    for (int64_t h = 0; h < s.H; ++h)
      std::memcpy(&y[(bt * s.H + h) * s.D], &x[(bt * s.KV + h / g) * s.D], s.D * sizeof(float));
  return y;
}

// [B, T, H, D] -> [B, T, KV, D]: sums the gradients of the query heads of a group.
std::vector<float> fold(const std::vector<float>& x, const Shape& s) {
  std::vector<float> y(static_cast<size_t>(s.B * s.T * s.KV * s.D), 0.0f);
  const int64_t g = s.H / s.KV;
  for (int64_t bt = 0; bt < s.B * s.T; ++bt)
    for (int64_t h = 0; h < s.H; ++h)
      for (int64_t d = 0; d < s.D; ++d) y[(bt * s.KV + h / g) * s.D + d] += x[(bt * s.H + h) * s.D + d];
  return y;
}

struct Row {
  Variant v;
  int e = 0;  // 1: K and V expanded to H heads
  GraphPtr g;
  std::string err, note;
  std::unordered_map<int64_t, void*> pack;
  Scalars sc{}, got{};  // scales sent, scalars (amaxes) read back
  float ms = -1;
};

int main(int argc, char** argv) {
  if (argc < 6) {
    std::printf("usage: attention_fp8 B T H KV D\n");
    return 2;
  }
  const Shape s{std::atoll(argv[1]), std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), std::atoll(argv[5])};
  if (s.B < 1 || s.T < 1 || s.D < 1 || s.KV < 1 || s.H % s.KV != 0) {
    std::printf("need B, T, D >= 1 and H a multiple of KV\n");
    return 2;
  }
  cudnnHandle_t handle;
  if (cudnnCreate(&handle) != CUDNN_STATUS_SUCCESS) {
    std::printf("cudnnCreate failed\n");
    return 1;
  }
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  cudnnSetStream(handle, stream);
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  std::printf("# attention_fp8 B=%lld T=%lld H=%lld KV=%lld D=%lld causal; %s sm_%d%d, cuDNN %zu, frontend %d\n",
              (long long)s.B, (long long)s.T, (long long)s.H, (long long)s.KV, (long long)s.D, prop.name, prop.major,
              prop.minor, cudnnGetVersion(), CUDNN_FRONTEND_VERSION);

  // Graphs first, so that one workspace can be sized for all of them.
  const DT E4 = DT::FP8_E4M3, E5 = DT::FP8_E5M2, BF = DT::BFLOAT16;
  std::vector<Row> rows;
  auto add = [&](Variant v, int e, bool may_expand) {
    Row r;
    r.v = std::move(v);
    r.e = e;
    r.g = build(s, e ? s.H : s.KV, r.v, handle, r.err);
    if (!r.g && may_expand && s.KV < s.H) {
      std::string err;
      r.g = build(s, s.H, r.v, handle, err);
      if (r.g) {
        r.e = 1;
        r.note = "GQA graph (KV=" + std::to_string(s.KV) + ") refused: " + r.err + "; ran with K, V expanded to " +
                 std::to_string(s.H) + " heads";
        r.err.clear();
      } else {
        r.err += " | with K, V expanded to H heads: " + err;
      }
    }
    rows.push_back(std::move(r));
  };
  add({"bf16 fwd", false, false}, 0, false);
  add({"bf16 bwd", false, true}, 0, false);
  add({"fp8 fwd e4m3", true, false}, 0, true);
  add({"fp8 bwd dO e4m3, dQKV e4m3", true, true, E4, E4}, 0, true);
  add({"fp8 bwd dO e5m2, dQKV e5m2", true, true, E5, E5}, 0, true);
  add({"fp8 bwd dO e4m3, dQKV bf16", true, true, E4, BF}, 0, true);
  const bool expanded = std::any_of(rows.begin(), rows.end(), [](const Row& r) { return r.e == 1; });
  if (expanded) {
    add({"bf16 fwd, K,V expanded", false, false}, 1, false);
    add({"bf16 bwd, K,V expanded", false, true}, 1, false);
  }
  int64_t ws_bytes = 0;
  for (auto& r : rows) {
    int64_t need = 0;
    if (r.g && r.g->get_workspace_size(need).is_good()) ws_bytes = std::max(ws_bytes, need);
  }
  void* ws = nullptr;
  if (ws_bytes > 0) CK(cudaMalloc(&ws, ws_bytes));
  std::printf("# workspace %.1f MiB\n", ws_bytes / 1048576.0);

  // Data. Index [e]: K/V-sized buffers with KV heads (0) and expanded to H heads (1).
  const size_t nq = s.B * s.T * s.H * s.D, nk = s.B * s.T * s.KV * s.D, nstats = s.B * s.H * s.T;
  Rng rng{20240611};
  std::vector<float> qf = normal(nq, rng), kf[2], vf[2], dof;
  kf[0] = normal(nk, rng);
  vf[0] = normal(nk, rng);
  dof = normal(nq, rng);
  if (expanded) kf[1] = expand(kf[0], s), vf[1] = expand(vf[0], s);
  auto zeros = [&](size_t bytes) {
    void* d;
    CK(cudaMalloc(&d, bytes));
    CK(cudaMemset(d, 0, bytes));
    return d;
  };
  void *qb = upload<__nv_bfloat16>(qf), *q8 = upload<__nv_fp8_e4m3>(qf);
  void *dob = upload<__nv_bfloat16>(dof), *do8[2] = {upload<__nv_fp8_e4m3>(dof), upload<__nv_fp8_e5m2>(dof)};
  void *kb[2] = {}, *vb[2] = {}, *k8[2] = {}, *v8[2] = {}, *dkb[2] = {}, *dvb[2] = {}, *dk8[2] = {}, *dv8[2] = {};
  for (int e = 0; e < (expanded ? 2 : 1); ++e) {
    const size_t n = e ? nq : nk;
    kb[e] = upload<__nv_bfloat16>(kf[e]), vb[e] = upload<__nv_bfloat16>(vf[e]);
    k8[e] = upload<__nv_fp8_e4m3>(kf[e]), v8[e] = upload<__nv_fp8_e4m3>(vf[e]);
    dkb[e] = zeros(2 * n), dvb[e] = zeros(2 * n), dk8[e] = zeros(2 * n), dv8[e] = zeros(2 * n);  // 2 bytes: bf16 grads
  }
  void *ob = zeros(2 * nq), *o8 = zeros(nq), *statsb = zeros(4 * nstats), *stats8 = zeros(4 * nstats);
  void *dqb = zeros(2 * nq), *dq8 = zeros(2 * nq);
  float* dsc = static_cast<float*>(zeros(sizeof(Scalars)));
  for (auto& r : rows) {
    const bool f = r.v.fp8;
    const int e = r.e;
    r.pack = {{kQ, f ? q8 : qb},         {kK, f ? k8[e] : kb[e]},   {kV, f ? v8[e] : vb[e]},
              {kO, f ? o8 : ob},         {kStats, f ? stats8 : statsb},
              {kDO, f ? do8[r.v.dO == E5] : dob},
              {kDQ, f ? dq8 : dqb},      {kDK, f ? dk8[e] : dkb[e]}, {kDV, f ? dv8[e] : dvb[e]}};
    for (int64_t u = kDescQ; u < kUids; ++u) r.pack[u] = dsc + u;
    r.sc.fill(1.0f);
  }
  auto exec = [&](Row& r) {
    CK(cudaMemcpy(dsc, r.sc.data(), sizeof(Scalars), cudaMemcpyHostToDevice));
    auto st = r.g->execute(handle, r.pack, ws);
    const cudaError_t ce = cudaStreamSynchronize(stream);
    if (!st.is_good() || ce != cudaSuccess) {
      r.err = "execute: " + (st.is_good() ? std::string(cudaGetErrorString(ce)) : st.get_message());
      r.g = nullptr;
      return false;
    }
    CK(cudaMemcpy(r.got.data(), dsc, sizeof(Scalars), cudaMemcpyDeviceToHost));
    return true;
  };
  auto find = [&](const std::string& name) { return &*std::find_if(rows.begin(), rows.end(), [&](const Row& r) { return r.v.name == name; }); };

  // BF16 reference outputs (GQA graphs).
  std::vector<float> o_ref, dq_ref, dk_ref, dv_ref;
  if (Row* r = find("bf16 fwd"); r->g && exec(*r)) o_ref = download(ob, nq, BF);
  if (Row* r = find("bf16 bwd"); r->g && exec(*r)) {
    dq_ref = download(dqb, nq, BF), dk_ref = download(dkb[0], nk, BF), dv_ref = download(dvb[0], nk, BF);
  }

  // FP8 forward: unit scales, then scales from that run's amaxes (amax is taken before scaling).
  float scale_s = pow2_scale(1.0f, 448.0f), scale_o = 1.0f;  // P <= 1
  if (Row* r = find("fp8 fwd e4m3"); r->g && exec(*r)) {
    const double unit = rel_l2(download(o8, nq, E4), o_ref);
    scale_s = pow2_scale(r->got[kAmaxS], 448.0f), scale_o = pow2_scale(r->got[kAmaxO], 448.0f);
    r->sc[kScaleS] = scale_s, r->sc[kDescS] = 1.0f / scale_s, r->sc[kScaleO] = scale_o;
    if (exec(*r))
      std::printf("check %s: O rel-L2 err %.2e (unit scales %.2e); amax S %.4f O %.4f (bf16 max|O| %.4f); scale S %g O %g\n",
                  r->v.name.c_str(), rel_l2(download(o8, nq, E4, 1.0f / scale_o), o_ref), unit, r->got[kAmaxS],
                  r->got[kAmaxO], o_ref.empty() ? NAN : max_abs(o_ref), scale_s, scale_o);
  }
  if (!find("fp8 fwd e4m3")->g && !o_ref.empty()) {  // backward inputs from the BF16 forward instead
    scale_o = pow2_scale(max_abs(o_ref), 448.0f);
    void* t = upload<__nv_fp8_e4m3>(o_ref, scale_o);
    CK(cudaMemcpy(o8, t, nq, cudaMemcpyDeviceToDevice));
    CK(cudaFree(t));
    CK(cudaMemcpy(stats8, statsb, 4 * nstats, cudaMemcpyDeviceToDevice));
    std::printf("note: no FP8 forward; FP8 backward rows take O (quantized, scale %g) and stats from the BF16 forward\n", scale_o);
  }

  // FP8 backward: unit scales (O's descale excepted), then two rounds of amax-derived scales
  // (dS is quantized with the dP scale, so dQ/dK's amax is right only once that scale is).
  for (auto& r : rows) {
    if (!r.v.fp8 || !r.v.bwd || !r.g) continue;
    const DT gt = r.v.dqkv;
    auto grads = [&](Row& x, std::vector<double>& err) {
      const int64_t nkv = x.e ? nq : nk;
      auto dk = download(dk8[x.e], nkv, gt, 1.0f / x.sc[kScaleDK]), dv = download(dv8[x.e], nkv, gt, 1.0f / x.sc[kScaleDV]);
      if (x.e) dk = fold(dk, s), dv = fold(dv, s);
      err = {rel_l2(download(dq8, nq, gt, 1.0f / x.sc[kScaleDQ]), dq_ref), rel_l2(dk, dk_ref), rel_l2(dv, dv_ref)};
    };
    r.sc[kDescO] = 1.0f / scale_o;
    std::vector<double> unit, scaled;
    if (!exec(r)) continue;
    grads(r, unit);
    r.sc[kScaleS] = scale_s, r.sc[kDescS] = 1.0f / scale_s;
    bool ok = true;
    for (int round = 0; round < 2 && ok; ++round) {
      r.sc[kScaleDP] = pow2_scale(r.got[kAmaxDP], fp8_max(r.v.dO)), r.sc[kDescDP] = 1.0f / r.sc[kScaleDP];
      r.sc[kScaleDQ] = pow2_scale(r.got[kAmaxDQ], fp8_max(gt));
      r.sc[kScaleDK] = pow2_scale(r.got[kAmaxDK], fp8_max(gt));
      r.sc[kScaleDV] = pow2_scale(r.got[kAmaxDV], fp8_max(gt));
      ok = exec(r);
    }
    if (!ok) continue;
    grads(r, scaled);
    std::printf("check %s: rel-L2 err dQ %.2e dK %.2e dV %.2e (unit scales %.2e %.2e %.2e); "
                "amax dP %.3g dQ %.3g dK %.3g dV %.3g (bf16 max|dQ| %.3g |dK| %.3g |dV| %.3g)\n",
                r.v.name.c_str(), scaled[0], scaled[1], scaled[2], unit[0], unit[1], unit[2], r.got[kAmaxDP],
                r.got[kAmaxDQ], r.got[kAmaxDK], r.got[kAmaxDV], dq_ref.empty() ? NAN : max_abs(dq_ref),
                dk_ref.empty() ? NAN : max_abs(dk_ref), dv_ref.empty() ? NAN : max_abs(dv_ref));
  }

  // Timing: minimum over 5 rounds of 10 runs, after 3 warm-up runs.
  for (auto& r : rows) {
    if (!r.g || !exec(r)) continue;
    for (int i = 0; i < 2; ++i) (void)r.g->execute(handle, r.pack, ws);
    r.ms = min_of_rounds_ms(stream, 10, [&] { (void)r.g->execute(handle, r.pack, ws); });
  }

  const double fwd_flops = 2.0 * s.B * s.H * s.T * s.T * s.D;
  std::printf("%-34s %5s %9s %8s\n", "pass", "K,V", "ms", "TFLOP/s");
  for (auto& r : rows) {
    const long long kvh = r.e ? s.H : s.KV;
    if (r.ms > 0)
      std::printf("%-34s %5lld %9.4f %8.1f\n", r.v.name.c_str(), kvh, r.ms,
                  (r.v.bwd ? 2.5 : 1.0) * fwd_flops / (r.ms * 1e-3) / 1e12);
    else
      std::printf("%-34s %5lld   failed: %s\n", r.v.name.c_str(), kvh, r.err.c_str());
  }
  for (auto& r : rows)
    if (!r.note.empty()) std::printf("note: %s: %s\n", r.v.name.c_str(), r.note.c_str());

  // Speedups: BF16 ms / FP8 ms (above 1: FP8 faster), against BF16 as the trainer runs it
  // (GQA) and, where an FP8 row needed K, V expanded, against BF16 expanded likewise.
  const Row* f8 = find("fp8 fwd e4m3");
  for (int e = 0; e < (expanded ? 2 : 1); ++e) {
    const Row* bf = find(e ? "bf16 fwd, K,V expanded" : "bf16 fwd");
    const Row* bb = find(e ? "bf16 bwd, K,V expanded" : "bf16 bwd");
    std::printf("speedup bf16/fp8 against bf16 with K,V %s:\n", e ? "expanded to H heads" : "at KV heads");
    if (bf->ms > 0 && f8->ms > 0) std::printf("  fwd %.2fx\n", bf->ms / f8->ms);
    for (auto& r : rows) {
      if (!r.v.fp8 || !r.v.bwd || r.ms <= 0 || bb->ms <= 0) continue;
      std::printf("  %-32s bwd %.2fx", r.v.name.c_str(), bb->ms / r.ms);
      if (bf->ms > 0 && f8->ms > 0) std::printf("  fwd+bwd %.2fx", (bf->ms + bb->ms) / (f8->ms + r.ms));
      std::printf("\n");
    }
  }
  return rows[0].ms > 0 && rows[1].ms > 0 ? 0 : 1;
}
