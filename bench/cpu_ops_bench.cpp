// Micro-benchmarks of the cpu backend's heavy ops at the default model's shapes (hidden 256,
// 4 heads of 64, FFN 704, batch 16 x seq 256 = 4096 rows): the four linear layers forward and
// backward, and attention forward and backward. Counters report GFLOP/s by the FLOP formulas of
// backend.cpp, read back through a TraceObserver so the bench and the planner count alike.
#include <benchmark/benchmark.h>

#include <vector>

#include "mxtrain/backend/cpu/cpu_backend.hpp"

namespace mxtrain {
namespace {

constexpr int64_t kRows = 4096, kSeq = 256, kHidden = 256, kHeads = 4, kFfn = 704;

class FlopCounter final : public TraceObserver {
 public:
  void on_op(const OpRecord& record) override { flops += record.flops; }
  double flops = 0;
};

Buffer filled(Backend& backend, Shape shape, float value) {
  Buffer buffer = backend.allocate("bench", shape, DType::f32, Lifetime::scratch);
  backend.fill(buffer, value);
  return buffer;
}

void report(benchmark::State& state, const FlopCounter& counter) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(counter.flops * 1e-9, benchmark::Counter::kIsRate);
}

// Args: out_features, in_features, which (0 forward, 1 backward_input, 2 backward_weight).
void BM_Linear(benchmark::State& state) {
  const int64_t out_features = state.range(0), in_features = state.range(1);
  CpuBackend backend(0);
  Buffer x = filled(backend, Shape{kRows, in_features}, 0.01f);
  Buffer weight = filled(backend, Shape{out_features, in_features}, 0.02f);
  Buffer out = filled(backend, Shape{kRows, out_features}, 0.0f);
  FlopCounter counter;
  backend.set_observer(&counter);
  for (auto _ : state) {
    switch (state.range(2)) {
      case 0: backend.gemm({.role = GemmRole::forward, .a = x, .b = weight, .out = out}); break;
      case 1: backend.gemm({.role = GemmRole::backward_input, .a = out, .b = weight, .out = x}); break;
      default: backend.gemm({.role = GemmRole::backward_weight, .a = out, .b = x, .out = weight,
                             .accumulate = true}); break;
    }
    benchmark::ClobberMemory();
  }
  report(state, counter);
}

void linear_shapes(benchmark::internal::Benchmark* bench) {
  const int64_t qkv = 3 * kHidden;  // kv_heads = heads in the default model
  for (int which = 0; which < 3; ++which) {
    bench->Args({qkv, kHidden, which});
    bench->Args({kHidden, kHidden, which});
    bench->Args({2 * kFfn, kHidden, which});
    bench->Args({kHidden, kFfn, which});
  }
  bench->ArgNames({"out", "in", "fwd0_dx1_dw2"});
}
BENCHMARK(BM_Linear)->Apply(linear_shapes)->Unit(benchmark::kMillisecond)->UseRealTime();

// Arg: 0 forward, 1 backward.
void BM_Attention(benchmark::State& state) {
  AttentionShape shape;
  shape.batch = kRows / kSeq;
  shape.seq = kSeq;
  shape.heads = kHeads;
  shape.kv_heads = kHeads;
  shape.head_dim = kHidden / kHeads;
  CpuBackend backend(0);
  std::vector<float> values(static_cast<size_t>(kRows * shape.qkv_cols()));
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 97) / 97.0f - 0.5f;
  Buffer qkv = backend.allocate("qkv", Shape{kRows, shape.qkv_cols()}, DType::f32, Lifetime::scratch);
  backend.copy_from_host(values.data(), qkv);
  Buffer out = filled(backend, Shape{kRows, kHidden}, 0.0f);
  Buffer lse = filled(backend, Shape{shape.batch, kHeads, kSeq}, 0.0f);
  Buffer dout = filled(backend, Shape{kRows, kHidden}, 0.01f);
  Buffer dqkv = filled(backend, Shape{kRows, shape.qkv_cols()}, 0.0f);
  backend.attention_forward(qkv, out, lse, shape);
  FlopCounter counter;
  backend.set_observer(&counter);
  for (auto _ : state) {
    if (state.range(0) == 0) {
      backend.attention_forward(qkv, out, lse, shape);
    } else {
      backend.attention_backward(dout, qkv, out, lse, dqkv, shape);
    }
    benchmark::ClobberMemory();
  }
  report(state, counter);
}
BENCHMARK(BM_Attention)->Arg(0)->Arg(1)->ArgName("fwd0_bwd1")->Unit(benchmark::kMillisecond)->UseRealTime();

}  // namespace
}  // namespace mxtrain
