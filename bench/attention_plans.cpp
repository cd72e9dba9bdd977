// Every cuDNN SDPA execution plan for one attention shape, timed: the heuristics' lists (modes
// A, B, FALLBACK, all plans built) and, for each engine those lists name, every value of each
// of its knobs around the heuristics' choice. Prints one line per plan, fastest first.
// Usage: attention_plans B T H KV D [fwd|bwd]
// Build (not part of the CMake build; a measuring tool for the GPU machine):
//   nvcc -std=c++20 -O2 -x cu bench/attention_plans.cpp -o build/attention_plans \
//        -I<cudnn-frontend include> -lcudnn -lnvrtc -lcuda
// Results: bench/results/h200_attention_plans.md.
#include "sdpa_probe.hpp"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

std::shared_ptr<fe::graph::Graph> make_graph(const Shape& s, bool backward, cudnnHandle_t handle) {
  auto g = bf16_sdpa_graph(s, backward);
  if (!g->validate().is_good() || !g->build_operation_graph(handle).is_good()) {
    std::printf("graph failed\n");
    std::exit(1);
  }
  return g;
}

struct Result {
  float ms;
  std::string name;
};

int main(int argc, char** argv) {
  if (argc < 7) {
    std::printf("usage: attention_plans B T H KV D fwd|bwd\n");
    return 2;
  }
  Shape s{std::atoll(argv[1]), std::atoll(argv[2]), std::atoll(argv[3]), std::atoll(argv[4]), std::atoll(argv[5])};
  const bool backward = std::string(argv[6]) == "bwd";
  const CudnnOnStream cudnn = cudnn_on_stream();
  cudnnHandle_t handle = cudnn.handle;
  cudaStream_t stream = cudnn.stream;
  const int64_t W = (s.H + 2 * s.KV) * s.D;
  const ProbeBuffers buffers = allocate_probe_buffers(s);
  void* ws;
  const size_t ws_bytes = size_t(1) << 30;
  CK(cudaMalloc(&ws, ws_bytes));
  CK(cudaMemset(buffers.qkv, 0x3c, s.B * s.T * W * 2));
  CK(cudaMemset(buffers.dout, 0x3c, s.B * s.T * s.H * s.D * 2));
  std::unordered_map<int64_t, void*> pack = probe_pack(s, buffers);
  if (!backward) {
    for (int64_t uid : {kDO, kDQ, kDK, kDV}) pack.erase(uid);  // the forward graph's tensors only
  } else {
    // Real O and stats from the forward.
    auto f = make_graph(s, false, handle);
    f->create_execution_plans({fe::HeurMode_t::A});
    f->check_support(handle);
    f->build_plans(handle);
    f->execute(handle, pack, ws);
    CK(cudaStreamSynchronize(stream));
  }
  auto time_plan = [&](fe::graph::Graph& g, int64_t i) -> float {
    int64_t need = 0;
    g.get_workspace_size_plan_at_index(i, need);
    if (need > static_cast<int64_t>(ws_bytes)) return -1;
    if (!g.execute_plan_at_index(handle, pack, ws, i).is_good()) return -1;
    if (cudaStreamSynchronize(stream) != cudaSuccess) return -1;
    return min_of_rounds_ms(stream, 4, [&] { (void)g.execute_plan_at_index(handle, pack, ws, i); });
  };
  std::vector<Result> results;
  std::map<int64_t, std::unordered_map<fe::KnobType_t, int64_t>> engines;
  for (auto mode : {fe::HeurMode_t::A, fe::HeurMode_t::B, fe::HeurMode_t::FALLBACK}) {
    auto g = make_graph(s, backward, handle);
    if (!g->create_execution_plans({mode}).is_good()) continue;
    g->check_support(handle);
    g->build_plans(fe::BuildPlanPolicy_t::ALL);
    const int64_t n = g->get_execution_plan_count();
    std::printf("mode %d: %lld plans\n", static_cast<int>(mode), static_cast<long long>(n));
    for (int64_t i = 0; i < n; ++i) {
      std::string name;
      g->get_plan_name_at_index(i, name);
      int64_t engine = -1;
      std::unordered_map<fe::KnobType_t, int64_t> knobs;
      if (g->get_engine_and_knobs_at_index(i, engine, knobs).is_good() && !engines.count(engine)) engines[engine] = knobs;
      const float ms = time_plan(*g, i);
      std::printf("  plan %lld %s engine %lld: %.4f ms\n", static_cast<long long>(i), name.c_str(),
                  static_cast<long long>(engine), ms);
      if (ms > 0) results.push_back({ms, "mode " + std::to_string(static_cast<int>(mode)) + " " + name});
    }
  }
  for (auto& [engine, chosen] : engines) {
    auto probe = make_graph(s, backward, handle);
    std::vector<fe::Knob> knobs;
    if (!probe->get_knobs_for_engine(engine, knobs).is_good()) continue;
    std::printf("engine %lld knobs:", static_cast<long long>(engine));
    for (auto& k : knobs)
      std::printf(" [%d: %lld..%lld/%lld chosen %lld]", static_cast<int>(k.type), static_cast<long long>(k.minValue),
                  static_cast<long long>(k.maxValue), static_cast<long long>(k.stride),
                  static_cast<long long>(chosen.count(k.type) ? chosen[k.type] : -1));
    std::printf("\n");
    int builds = 0;
    for (auto& k : knobs) {
      const int64_t stride = k.stride > 0 ? k.stride : 1;
      for (int64_t value = k.minValue; value <= k.maxValue && builds < 400; value += stride) {
        auto choice = chosen;
        if (choice.count(k.type) && choice[k.type] == value) continue;
        choice[k.type] = value;
        auto g = make_graph(s, backward, handle);
        ++builds;
        if (!g->create_execution_plan(engine, choice).is_good()) continue;
        if (!g->check_support(handle).is_good()) continue;
        if (!g->build_plan_at_index(0).is_good()) continue;
        const float ms = time_plan(*g, 0);
        std::string name;
        g->get_plan_name_at_index(0, name);
        std::printf("  knob %d = %lld: %s %.4f ms\n", static_cast<int>(k.type), static_cast<long long>(value),
                    name.c_str(), ms);
        if (ms > 0) results.push_back({ms, name + " knob " + std::to_string(static_cast<int>(k.type)) + "=" + std::to_string(value)});
      }
    }
  }
  std::sort(results.begin(), results.end(), [](const Result& x, const Result& y) { return x.ms < y.ms; });
  std::printf("# fastest\n");
  for (size_t i = 0; i < results.size() && i < 15; ++i) std::printf("%.4f ms  %s\n", results[i].ms, results[i].name.c_str());
  return 0;
}
