// The dryrun backend prices exactly what the cpu backend runs: the same op sequence (every op
// kind, in several phases) on both reports identical OpRecords (kind, phase, dtype, FLOPs, bytes,
// GEMM shape) and identical allocation events (names, rounded bytes, live bytes after each).
#include <set>

#include "backend/cpu_op_checks.hpp"
#include "mxtrain/backend/dryrun/dryrun_backend.hpp"

namespace mxtrain::test {
namespace {

class Recorder final : public TraceObserver {
 public:
  void on_op(const OpRecord& record) override { ops.push_back(record); }
  void on_allocation(const AllocationEvent& event) override { allocations.push_back(event); }
  std::vector<OpRecord> ops;
  std::vector<AllocationEvent> allocations;
};

// A small llama-and-gpt2 step: every op kind once or more. Inputs are filled with constants so
// the cpu has valid data (token 0, target 0) without host uploads the dryrun would not see.
void run_step(Backend& backend) {
  const int64_t batch = 2, seq = 6, hidden = 16, vocab = 12, padded_vocab = 16, ffn = 24;
  const int64_t rows = batch * seq;
  AttentionShape shape;
  shape.batch = batch;
  shape.seq = seq;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.head_dim = hidden / 4;
  auto f32 = [&](const char* name, Shape s, float value, Lifetime lifetime = Lifetime::activation) {
    Buffer buffer = backend.allocate(name, s, DType::f32, lifetime);
    backend.fill(buffer, value);
    return buffer;
  };

  Buffer tokens = backend.allocate("tokens", Shape{batch, seq}, DType::i32, Lifetime::data);
  backend.fill(tokens, 0.0f);
  const std::vector<int32_t> host_targets(static_cast<size_t>(rows), 3);
  Buffer targets = backend.allocate("targets", Shape{rows}, DType::i32, Lifetime::data);
  backend.copy_from_host(host_targets.data(), targets);
  Buffer table = f32("embed.tokens", Shape{padded_vocab, hidden}, 0.5f, Lifetime::parameter);
  Buffer positions = f32("embed.positions", Shape{seq, hidden}, 0.25f, Lifetime::parameter);
  Buffer norm_weight = f32("norm.weight", Shape{hidden}, 1.0f, Lifetime::parameter);
  Buffer norm_bias = f32("norm.bias", Shape{hidden}, 0.0f, Lifetime::parameter);
  Buffer qkv_weight = f32("qkv.weight", Shape{shape.qkv_cols(), hidden}, 0.01f, Lifetime::parameter);
  Buffer qkv_bias = f32("qkv.bias", Shape{shape.qkv_cols()}, 0.1f, Lifetime::parameter);

  PhaseScope forward(backend, Phase::forward);
  Buffer x = f32("x", Shape{rows, hidden}, 0.0f);
  backend.embedding_forward(tokens, table, positions, x, seq);
  Buffer normed = f32("normed", Shape{rows, hidden}, 0.0f);
  Buffer mean = f32("mean", Shape{rows}, 0.0f), rstd = f32("rstd", Shape{rows}, 0.0f);
  backend.norm_forward(NormKind::layer, x, norm_weight, norm_bias, normed, mean, rstd, 1e-5f);
  backend.norm_forward(NormKind::rms, x, norm_weight, Tensor(), normed, Tensor(), rstd, 1e-5f);
  Buffer qkv = f32("qkv", Shape{rows, shape.qkv_cols()}, 0.0f);
  backend.gemm({.role = GemmRole::forward, .a = normed, .b = qkv_weight, .out = qkv, .bias = qkv_bias});
  backend.rope_forward(qkv, shape, 10000.0f);
  Buffer attn = f32("attn", Shape{rows, hidden}, 0.0f);
  Buffer lse = f32("lse", Shape{batch, shape.heads, seq}, 0.0f);
  backend.attention_forward(qkv, attn, lse, shape);
  Buffer mid = f32("mid", Shape{rows, hidden}, 0.0f);
  backend.add_norm_forward(NormKind::rms, x, attn, mid, norm_weight, Tensor(), normed, Tensor(), rstd, 1e-5f);
  Buffer up = f32("up", Shape{rows, 2 * ffn}, 0.3f);
  Buffer act = f32("act", Shape{rows, ffn}, 0.0f);
  backend.swiglu_forward(up, act);
  Buffer gelu_out = f32("gelu", Shape{rows, 2 * ffn}, 0.0f);
  backend.gelu_forward(up, gelu_out);
  Buffer logits = f32("logits", Shape{rows, padded_vocab}, 0.0f, Lifetime::scratch);
  backend.gemm({.role = GemmRole::forward, .a = normed, .b = table, .out = logits});
  Buffer losses = f32("losses", Shape{rows}, 0.0f, Lifetime::scratch);
  backend.cross_entropy(logits, targets, losses, vocab, 1.0f / static_cast<float>(rows));
  Buffer loss_sum = f32("loss_sum", Shape{1}, 0.0f, Lifetime::scratch);
  backend.sum(losses, loss_sum, true);

  PhaseScope backward(backend, Phase::backward);
  Buffer dtable = f32("embed.tokens.grad", Shape{padded_vocab, hidden}, 0.0f, Lifetime::gradient);
  Buffer dpositions = f32("embed.positions.grad", Shape{seq, hidden}, 0.0f, Lifetime::gradient);
  Buffer dnorm_weight = f32("norm.weight.grad", Shape{hidden}, 0.0f, Lifetime::gradient);
  Buffer dnorm_bias = f32("norm.bias.grad", Shape{hidden}, 0.0f, Lifetime::gradient);
  Buffer dqkv_weight = f32("qkv.weight.grad", Shape{shape.qkv_cols(), hidden}, 0.0f, Lifetime::gradient);
  Buffer dqkv_bias = f32("qkv.bias.grad", Shape{shape.qkv_cols()}, 0.0f, Lifetime::gradient);
  Buffer dnormed = f32("normed.grad", Shape{rows, hidden}, 0.0f, Lifetime::scratch);
  backend.gemm({.role = GemmRole::backward_weight, .a = logits, .b = normed, .out = dtable, .accumulate = true});
  backend.gemm({.role = GemmRole::backward_input, .a = logits, .b = table, .out = dnormed});
  Buffer dup = f32("up.grad", Shape{rows, 2 * ffn}, 0.0f, Lifetime::scratch);
  backend.swiglu_backward(act, up, dup);
  backend.gelu_backward(gelu_out, up, dup);
  Buffer dattn = f32("attn.grad", Shape{rows, hidden}, 0.1f, Lifetime::scratch);
  Buffer dqkv = f32("qkv.grad", Shape{rows, shape.qkv_cols()}, 0.0f, Lifetime::scratch);
  backend.attention_backward(dattn, qkv, attn, lse, dqkv, shape);
  backend.rope_backward(dqkv, shape, 10000.0f);
  {
    PhaseScope recompute(backend, Phase::recompute);
    backend.norm_forward(NormKind::layer, x, norm_weight, norm_bias, normed, mean, rstd, 1e-5f);
  }
  backend.gemm({.role = GemmRole::backward_weight, .a = dqkv, .b = normed, .out = dqkv_weight, .accumulate = true,
                .bias_gradient = dqkv_bias});
  backend.gemm({.role = GemmRole::backward_input, .a = dqkv, .b = qkv_weight, .out = dnormed, .accumulate = true});
  Buffer dx = f32("x.grad", Shape{rows, hidden}, 0.0f, Lifetime::scratch);
  backend.norm_backward(NormKind::layer, dnormed, x, norm_weight, mean, rstd, dx, dnorm_weight, dnorm_bias, false);
  backend.add(dx, dattn, dx);
  backend.embedding_backward(tokens, dx, dtable, dpositions, seq);

  PhaseScope optimizer(backend, Phase::optimizer);
  const int64_t count = shape.qkv_cols() * hidden;
  Buffer master = f32("qkv.weight.master", Shape{count}, 0.01f, Lifetime::master_parameter);
  Buffer m = f32("qkv.weight.m", Shape{count}, 0.0f, Lifetime::optimizer_state);
  Buffer v = f32("qkv.weight.v", Shape{count}, 0.0f, Lifetime::optimizer_state);
  Buffer compute = backend.allocate("qkv.weight.bf16", Shape{count}, DType::bf16, Lifetime::parameter);
  backend.copy(master, compute);
  Buffer norm_sq = f32("grad_norm_sq", Shape{1}, 0.0f, Lifetime::scratch);
  Tensor flat_grad = dqkv_weight.tensor().reshape(Shape{count});
  backend.sum_of_squares(flat_grad, norm_sq, false);
  backend.scale(flat_grad, 0.5f);
  AdamWArgs args;
  args.learning_rate = 1e-3f;
  args.decay_count = count / 2;
  args.weight_decay = 0.1f;
  args.max_grad_norm = 1.0f;
  backend.adamw(master, flat_grad, m, v, compute, norm_sq, args);
  std::vector<float> host(static_cast<size_t>(rows));
  backend.copy_to_host(losses, host.data());
}

TEST(CpuDryrunParity, SameOpRecordsAndAllocationsAsCpu) {
  CpuBackend cpu(2);
  DryrunBackend dryrun(0, "test");
  Recorder cpu_trace, dryrun_trace;
  cpu.set_observer(&cpu_trace);
  dryrun.set_observer(&dryrun_trace);
  run_step(cpu);
  run_step(dryrun);

  // Every op of the FP32 step (the precision-recipe ops have their own parity checks).
  const std::set<OpKind> step_ops = {
      OpKind::fill, OpKind::copy, OpKind::copy_from_host, OpKind::copy_to_host, OpKind::embedding_forward,
      OpKind::embedding_backward, OpKind::norm_forward, OpKind::add_norm_forward, OpKind::norm_backward,
      OpKind::linear_forward, OpKind::linear_backward_input, OpKind::linear_backward_weight, OpKind::rope_forward,
      OpKind::rope_backward, OpKind::attention_forward, OpKind::attention_backward, OpKind::swiglu_forward,
      OpKind::swiglu_backward, OpKind::gelu_forward, OpKind::gelu_backward, OpKind::add, OpKind::cross_entropy,
      OpKind::sum, OpKind::sum_of_squares, OpKind::scale, OpKind::adamw};
  std::set<OpKind> kinds;
  for (const OpRecord& op : cpu_trace.ops) kinds.insert(op.kind);
  EXPECT_EQ(kinds, step_ops) << "the step must exercise every op of the FP32 step";

  ASSERT_EQ(cpu_trace.ops.size(), dryrun_trace.ops.size());
  for (size_t i = 0; i < cpu_trace.ops.size(); ++i) {
    const OpRecord& a = cpu_trace.ops[i];
    const OpRecord& b = dryrun_trace.ops[i];
    SCOPED_TRACE(testing::Message() << "op " << i << " " << op_kind_name(a.kind));
    EXPECT_EQ(a.kind, b.kind);
    EXPECT_EQ(a.phase, b.phase);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.flops, b.flops);
    EXPECT_EQ(a.bytes, b.bytes);
    EXPECT_EQ(a.m, b.m);
    EXPECT_EQ(a.n, b.n);
    EXPECT_EQ(a.k, b.k);
  }
  ASSERT_EQ(cpu_trace.allocations.size(), dryrun_trace.allocations.size());
  for (size_t i = 0; i < cpu_trace.allocations.size(); ++i) {
    const AllocationEvent& a = cpu_trace.allocations[i];
    const AllocationEvent& b = dryrun_trace.allocations[i];
    EXPECT_EQ(a.name, b.name);
    EXPECT_EQ(a.bytes_rounded, b.bytes_rounded);
    EXPECT_EQ(a.live_bytes_after, b.live_bytes_after) << a.name;
  }
  EXPECT_EQ(cpu.memory_stats().peak_live_bytes, dryrun.memory_stats().peak_live_bytes);
  EXPECT_EQ(cpu.memory_stats().reserved_bytes, dryrun.memory_stats().reserved_bytes);

  // The phases the step set reach the records.
  std::set<Phase> phases;
  for (const OpRecord& op : cpu_trace.ops) phases.insert(op.phase);
  EXPECT_EQ(phases, (std::set<Phase>{Phase::other, Phase::forward, Phase::backward, Phase::recompute,
                                     Phase::optimizer}));
}

}  // namespace
}  // namespace mxtrain::test
