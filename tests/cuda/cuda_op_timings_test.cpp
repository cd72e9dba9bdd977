// Per-op timings at the shapes of the benchmark models, printed as a table: a measuring tool for
// the device machine, not a test of speed (it asserts nothing and is disabled by default; run
// it with --gtest_also_run_disabled_tests --gtest_filter='*OpTimings*'). Each op runs 3 times to
// warm up, then 20 times between two stream timestamps (MXTRAIN_OP_TIMING_REPEATS sets the 20;
// 0 runs each op of `time` once, untimed, for a profiler such as ncu); the table gives the mean
// time, the bytes or FLOPs the op must move or do (the Backend's own trace formulas), and the
// achieved rate against the H200 ceilings in docs/benchmarking.md (4.26 TB/s copy, 773 TFLOP/s bf16 GEMM).
#include <algorithm>
#include <cstdlib>
#include <functional>

#include "cuda/cuda_test_support.hpp"
#include "mxtrain/backend/cuda/quack_gemm.hpp"

namespace mxtrain::test {
namespace {

class Recorder final : public TraceObserver {
 public:
  void on_op(const OpRecord& record) override { last = record; }
  OpRecord last{};
};

class CudaOpTimings : public CudaTest {
 protected:
  void time(const std::string& what, const std::function<void()>& op) {
    Recorder recorder;
    cuda().set_observer(&recorder);
    op();
    const OpRecord record = recorder.last;
    cuda().set_observer(nullptr);
    const int repeats = timed_repeats();
    if (repeats == 0) {  // one launch of each op, for a profiler (ncu) to look at
      std::printf("[ time  ] %-58s ran once (MXTRAIN_OP_TIMING_REPEATS=0)\n", what.c_str());
      return;
    }
    for (int i = 0; i < 2; ++i) op();
    const uint64_t start = cuda().record_timestamp();
    for (int i = 0; i < repeats; ++i) op();
    const uint64_t end = cuda().record_timestamp();
    const double ms = cuda().elapsed_ms(start, end) / repeats;
    const double tbps = record.bytes / (ms * 1e-3) / 1e12;
    const double tflops = record.flops / (ms * 1e-3) / 1e12;
    const bool gemm_like = record.flops > 50 * record.bytes;
    std::printf("[ time  ] %-58s %9.3f ms  %8.1f MB  %7.2f TB/s (%3.0f%%)  %7.1f TFLOP/s%s\n", what.c_str(), ms,
                record.bytes / 1e6, tbps, 100 * tbps / 4.26, tflops,
                gemm_like ? strf(" (%2.0f%%)", 100 * tflops / 773).c_str() : "");
  }
  Buffer random(Shape shape, DType dtype, uint64_t seed, float low = -1, float high = 1) {
    return upload(cuda(), random_vector(static_cast<size_t>(shape.numel()), seed, low, high), shape, dtype);
  }
  // The timed launches of each op: 20, or MXTRAIN_OP_TIMING_REPEATS (0: the op runs once, untimed).
  static int timed_repeats() {
    const char* text = std::getenv("MXTRAIN_OP_TIMING_REPEATS");
    return text != nullptr && *text != '\0' ? std::max(0, std::atoi(text)) : kRepeats;
  }
  static constexpr int kRepeats = 20;
};

TEST_F(CudaOpTimings, DISABLED_ModelShapes) {
  const DType bf = DType::bf16;
  struct ModelShape {
    const char* name;
    int64_t rows, hidden, heads, kv_heads, ffn, vocab, seq;
    bool llama;
  };
  const ModelShape models[] = {{"gpt2-124m 64x1024", 65536, 768, 12, 12, 3072, 50304, 1024, false},
                               {"llama-1b 8x2048", 16384, 2048, 32, 4, 5632, 32000, 2048, true}};
  for (const ModelShape& s : models) {
    cuda_ = create_backend("cuda", BackendOptions{});  // fresh workspaces per model
    std::printf("[ time  ] ---- %s ----\n", s.name);
    const int64_t R = s.rows, C = s.hidden, D = C / s.heads;
    AttentionShape shape;
    shape.batch = R / s.seq;
    shape.seq = s.seq;
    shape.heads = s.heads;
    shape.kv_heads = s.kv_heads;
    shape.head_dim = D;
    shape.softmax_scale = 1.0f / std::sqrt(static_cast<float>(D));
    const NormKind norm = s.llama ? NormKind::rms : NormKind::layer;
    Buffer x = random(Shape{R, C}, bf, 1), y = random(Shape{R, C}, bf, 2), sum = random(Shape{R, C}, bf, 3);
    Buffer out = random(Shape{R, C}, bf, 4);
    Buffer w = random(Shape{C}, bf, 5, 0.5f, 1.5f), b = random(Shape{C}, bf, 6);
    Buffer mean = random(Shape{R}, DType::f32, 7), rstd = random(Shape{R}, DType::f32, 8, 0.5f, 1.5f);
    Buffer dw = random(Shape{C}, DType::f32, 9), db = random(Shape{C}, DType::f32, 10);
    const Tensor no;
    const Tensor bias = s.llama ? no : b.tensor(), m = s.llama ? no : mean.tensor();
    const Tensor dbias = s.llama ? no : db.tensor();
    time("norm_forward", [&] { cuda().norm_forward(norm, x, w, bias, out, m, rstd, 1e-5f); });
    time("add_norm_forward", [&] { cuda().add_norm_forward(norm, x, y, sum, w, bias, out, m, rstd, 1e-5f); });
    time("norm_backward (accumulate dx)", [&] { cuda().norm_backward(norm, y, x, w, m, rstd, out, dw, dbias, true); });
    if (!s.llama) {
      // GPT-2's MLP norm backward with the out and down projections' bias gradients (dx's
      // column sums in and out) against the two column sums they replace.
      Buffer bias_in = random(Shape{C}, bf, 30), bias_out = random(Shape{C}, bf, 31);
      const DxColumnSums sums{.in = bias_in, .out = bias_out};
      time("norm_backward (accumulate dx, dx column sums in and out)",
           [&] { cuda().norm_backward(norm, y, x, w, m, rstd, out, dw, dbias, true, true, {}, sums); });
      time("column_sum (one hidden-wide bias gradient)", [&] { cuda().column_sum(out, bias_in, true); });
    }
    time("add", [&] { cuda().add(x, y, out); });

    const int64_t up_cols = s.llama ? 2 * s.ffn : s.ffn;
    Buffer up = random(Shape{R, up_cols}, bf, 11, -3, 3), act = random(Shape{R, s.ffn}, bf, 12);
    Buffer dup = random(Shape{R, up_cols}, bf, 13);
    if (s.llama) {
      time("swiglu_forward", [&] { cuda().swiglu_forward(up, act); });
      time("swiglu_backward", [&] { cuda().swiglu_backward(act, up, dup); });
    } else {
      time("gelu_forward", [&] { cuda().gelu_forward(up, act); });
      time("gelu_backward", [&] { cuda().gelu_backward(act, up, dup); });
    }

    Buffer qkv = random(Shape{R, shape.qkv_cols()}, bf, 14), dqkv = random(Shape{R, shape.qkv_cols()}, bf, 15);
    Buffer attn = random(Shape{R, C}, bf, 16), lse = random(Shape{shape.batch, s.heads, s.seq}, DType::f32, 17);
    if (s.llama) time("rope_forward", [&] { cuda().rope_forward(qkv, shape, 10000.0f); });
    time("attention_forward", [&] { cuda().attention_forward(qkv, attn, lse, shape); });
    // A fresh backend per model would be cleaner; the workspace only grows, so print it after
    // the fast backward (the training default) and again after the deterministic one.
    cuda_backend().set_deterministic_attention(false);
    time("attention_backward (fast)", [&] { cuda().attention_backward(out, qkv, attn, lse, dqkv, shape); });
    std::printf("[ time  ] cuDNN workspace after forward + fast backward: %zu bytes\n",
                cuda_backend().attention_workspace_bytes());
    cuda_backend().set_deterministic_attention(true);
    time("attention_backward (deterministic)", [&] { cuda().attention_backward(out, qkv, attn, lse, dqkv, shape); });
    std::printf("[ time  ] cuDNN workspace after the deterministic backward too: %zu bytes\n",
                cuda_backend().attention_workspace_bytes());

    Buffer wq = random(Shape{shape.qkv_cols(), C}, bf, 18, -0.05f, 0.05f);
    Buffer dwq = random(Shape{shape.qkv_cols(), C}, DType::f32, 19);
    Buffer bq = random(Shape{shape.qkv_cols()}, bf, 20), dbq = random(Shape{shape.qkv_cols()}, DType::f32, 21);
    const Tensor qkv_bias = s.llama ? no : bq.tensor(), dqkv_bias = s.llama ? no : dbq.tensor();
    time("linear_forward qkv", [&] { cuda().gemm({.role = GemmRole::forward, .a = out, .b = wq, .out = qkv,
                                                  .bias = qkv_bias}); });
    time("linear_backward_input qkv", [&] { cuda().gemm({.role = GemmRole::backward_input, .a = dqkv, .b = wq,
                                                         .out = out}); });
    time("linear_backward_weight qkv (f32 grad)", [&] { cuda().gemm({.role = GemmRole::backward_weight, .a = dqkv,
                                                                     .b = out, .out = dwq, .accumulate = true,
                                                                     .bias_gradient = dqkv_bias}); });
    if (!s.llama) {
      cuda_backend().set_fused_bias_gradient(!cuda_backend().fused_bias_gradient());
      time(std::string("linear_backward_weight qkv (f32 grad) bias by ") +
               (cuda_backend().fused_bias_gradient() ? "BGRADB" : "column sums"),
           [&] { cuda().gemm({.role = GemmRole::backward_weight, .a = dqkv, .b = out, .out = dwq, .accumulate = true,
                              .bias_gradient = dqkv_bias}); });
      cuda_backend().set_fused_bias_gradient(!cuda_backend().fused_bias_gradient());
      Buffer dbo = random(Shape{C}, DType::f32, 36);
      Buffer wo = random(Shape{C, C}, DType::f32, 37);
      time("linear_backward_weight out (f32 grad) + bias", [&] { cuda().gemm({.role = GemmRole::backward_weight,
                                                                              .a = y, .b = attn, .out = wo,
                                                                              .accumulate = true,
                                                                              .bias_gradient = dbo}); });
      time("linear_backward_weight out (f32 grad), no bias", [&] { cuda().gemm({.role = GemmRole::backward_weight,
                                                                                .a = y, .b = attn, .out = wo,
                                                                                .accumulate = true,
                                                                                .bias_gradient = no}); });
    }
    Buffer wup = random(Shape{up_cols, C}, bf, 22, -0.05f, 0.05f);
    time("linear_forward mlp up", [&] { cuda().gemm({.role = GemmRole::forward, .a = out, .b = wup, .out = up,
                                                     .bias = no}); });
    // The fused epilogues against the GEMM + separate kernel they replace.
    Buffer wdown = random(Shape{C, s.ffn}, bf, 38, -0.05f, 0.05f);
    time("linear_forward mlp down, then add", [&] {
      cuda().gemm({.role = GemmRole::forward, .a = act, .b = wdown, .out = y, .bias = bias});
      cuda().add(y, x, out);
    });
    time("linear_forward_residual mlp down", [&] { cuda().gemm({.role = GemmRole::forward, .a = act, .b = wdown,
                                                                .out = out, .bias = bias, .residual = x}); });

    // The loss: one logits chunk of 8192 rows.
    const int64_t chunk = std::min<int64_t>(8192, R);
    Buffer logits = random(Shape{chunk, s.vocab}, bf, 23, -4, 4);
    std::vector<int32_t> ids(static_cast<size_t>(chunk));
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919) % s.vocab);
    Buffer targets = upload_i32(cuda(), ids, Shape{chunk}), losses = random(Shape{chunk}, DType::f32, 24);
    Buffer head = random(Shape{s.vocab, C}, bf, 25, -0.05f, 0.05f);
    time("linear_forward head (8192-row chunk)", [&] { cuda().gemm({.role = GemmRole::forward,
                                                                    .a = out.tensor().slice_rows(0, chunk), .b = head,
                                                                    .out = logits, .bias = no}); });
    time("cross_entropy (grad, 8192-row chunk)", [&] {
      cuda().cross_entropy(logits, targets, losses, s.vocab, 1e-5f);
    });

    std::vector<int32_t> tokens(static_cast<size_t>(R));
    for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<int32_t>((i * 104729) % s.vocab);
    Buffer token_ids = upload_i32(cuda(), tokens, Shape{R});
    Buffer table = random(Shape{s.vocab, C}, bf, 26), dtable = random(Shape{s.vocab, C}, DType::f32, 27);
    Buffer positions = random(Shape{s.seq, C}, bf, 28), dpositions = random(Shape{s.seq, C}, DType::f32, 29);
    const Tensor pos = s.llama ? no : positions.tensor(), dpos = s.llama ? no : dpositions.tensor();
    time("embedding_forward", [&] { cuda().embedding_forward(token_ids, table, pos, x, s.seq); });
    time("embedding_backward", [&] { cuda().embedding_backward(token_ids, y, dtable, dpos, s.seq); });

    const int64_t group = 12 * C * C;  // about one block's parameters
    Buffer master = random(Shape{group}, DType::f32, 30), grad = random(Shape{group}, DType::f32, 31);
    Buffer am = random(Shape{group}, DType::f32, 32), av = random(Shape{group}, DType::f32, 33, 0, 1e-4f);
    Buffer copy = random(Shape{group}, bf, 34), norm_sq = upload(cuda(), {4.0f}, Shape{1});
    AdamWArgs args;
    args.learning_rate = 1e-4f;
    args.max_grad_norm = 1.0f;
    args.decay_count = group / 2;
    time("adamw (one block's group)", [&] { cuda().adamw(master, grad, am, av, copy, norm_sq, args); });
    Buffer total = random(Shape{1}, DType::f32, 35);
    time("sum_of_squares (one block's f32 grads)", [&] { cuda().sum_of_squares(grad, total, true); });

    // Per-tensor FP8 (the fp8 recipes' passes over one linear input and one MLP-wide gradient).
    if (!s.llama) continue;
    Buffer scale = upload(cuda(), {8.0f}, Shape{1}), amax_out = random(Shape{1}, DType::f32, 39);
    for (int64_t cols : {C, s.ffn}) {
      Buffer input = random(Shape{R, cols}, bf, 40);
      Buffer row_codes = cuda().allocate("row", Shape{R, cols}, DType::e4m3, Lifetime::scratch);
      Buffer col_codes = cuda().allocate("col", Shape{cols, R}, DType::e4m3, Lifetime::scratch);
      Buffer row_inverse = cuda().allocate("row.si", Shape{1}, DType::f32, Lifetime::scratch);
      Buffer col_inverse = cuda().allocate("col.si", Shape{1}, DType::f32, Lifetime::scratch);
      QuantizedTensor rowwise, columnwise, none;
      rowwise.data = row_codes;
      rowwise.scale_inverse = row_inverse;
      columnwise.data = col_codes;
      columnwise.scale_inverse = col_inverse;
      columnwise.transposed = true;
      const std::string shape_name = strf(" [%lld x %lld]", static_cast<long long>(R), static_cast<long long>(cols));
      time("fp8 amax" + shape_name, [&] { cuda().amax(input, amax_out, false); });
      time("fp8 quantize rowwise + amax" + shape_name,
           [&] { cuda().quantize(input, scale, rowwise, none, amax_out); });
      time("fp8 quantize columnwise" + shape_name, [&] { cuda().quantize(input, scale, none, columnwise, Tensor()); });
      time("fp8 quantize both + amax" + shape_name,
           [&] { cuda().quantize(input, scale, rowwise, columnwise, amax_out); });
    }
    // SwiGLU's casts in a backward that recomputes the activation (delayed scaling): the
    // activation's columnwise cast for the down projection's weight gradient and the gate/up
    // gradient's cast, apart (two passes over gate_up) and as one pass.
    auto fp8_copy = [&](const char* name, int64_t rows, int64_t cols, DType element, bool transposed) {
      QuantizedTensor q;
      q.spec.element = element;
      q.transposed = transposed;
      q.data = cuda().allocate(name, transposed ? Shape{cols, rows} : Shape{rows, cols}, element, Lifetime::scratch);
      q.scale_inverse = cuda().allocate(std::string(name) + ".si", Shape{1}, DType::f32, Lifetime::scratch);
      return q;
    };
    const QuantizedTensor act_col = fp8_copy("act.col", R, s.ffn, DType::e4m3, true);
    const QuantizedTensor dup_row = fp8_copy("dup.row", R, 2 * s.ffn, DType::e5m2, false);
    const QuantizedTensor dup_col = fp8_copy("dup.col", R, 2 * s.ffn, DType::e5m2, true);
    const QuantizedTensor none;
    Buffer act_amax = random(Shape{1}, DType::f32, 41), dup_amax = random(Shape{1}, DType::f32, 42);
    const Tensor act_shape(nullptr, Shape{R, s.ffn}, bf, Device::cuda);
    const Tensor dup_shape(nullptr, Shape{R, 2 * s.ffn}, bf, Device::cuda);
    const CastProducer act_producer{.op = CastProducer::Op::swiglu_forward, .gate_up = up};
    CastProducer dup_producer{.op = CastProducer::Op::swiglu_backward, .gate_up = up, .dout = act};
    time("fp8 cast of the activation (swiglu_forward fused), columnwise", [&] {
      cuda().quantize(act_shape, scale, none, act_col, act_amax, ScaleFromAmax{}, act_producer);
    });
    time("fp8 cast of dgate_up (swiglu_backward fused), both", [&] {
      cuda().quantize(dup_shape, scale, dup_row, dup_col, dup_amax, ScaleFromAmax{}, dup_producer);
    });
    dup_producer.act_scale = scale;
    dup_producer.act_amax = act_amax;
    dup_producer.act_columnwise = act_col;
    time("fp8 cast of dgate_up with the activation's copy, one pass", [&] {
      cuda().quantize(dup_shape, scale, dup_row, dup_col, dup_amax, ScaleFromAmax{}, dup_producer);
    });
  }
}

// The norms at widths the model shapes above do not reach: GPT-2 1.5B's rows (16384 x 1600,
// LayerNorm with a bias: 6.25 vectors a lane, the fused backward split over pairs of warps, 800
// columns and the bias's second row of sums each) and Llama-3B's (8192 x 3072 RMSNorm: split over
// pairs of warps, 6 vectors a lane each; norm weights in BF16 as BF16 training keeps them, in FP32
// as the FP8 recipes do).
TEST_F(CudaOpTimings, DISABLED_WideNorms) {
  struct NormShape {
    const char* name;
    int64_t rows, cols;
    NormKind kind;
    DType weight;
  };
  const NormShape shapes[] = {{"gpt2-1.5b 16x1024 norms", 16384, 1600, NormKind::layer, DType::bf16},
                              {"llama-3b 4x2048 norms", 8192, 3072, NormKind::rms, DType::bf16},
                              {"llama-3b 4x2048 norms, fp32 weights", 8192, 3072, NormKind::rms, DType::f32}};
  const DType bf = DType::bf16;
  for (const NormShape& n : shapes) {
    std::printf("[ time  ] ---- %s ----\n", n.name);
    const int64_t R = n.rows, C = n.cols;
    const bool layer = n.kind == NormKind::layer;
    Buffer x = random(Shape{R, C}, bf, 1), y = random(Shape{R, C}, bf, 2), out = random(Shape{R, C}, bf, 4);
    Buffer w = random(Shape{C}, n.weight, 5, 0.5f, 1.5f), b = random(Shape{C}, n.weight, 6);
    Buffer mean = random(Shape{R}, DType::f32, 7), rstd = random(Shape{R}, DType::f32, 8, 0.5f, 1.5f);
    Buffer dw = random(Shape{C}, DType::f32, 9), db = random(Shape{C}, DType::f32, 10);
    const Tensor no;
    const Tensor bias = layer ? b.tensor() : no, m = layer ? mean.tensor() : no, dbias = layer ? db.tensor() : no;
    time("norm_forward", [&] { cuda().norm_forward(n.kind, x, w, bias, out, m, rstd, 1e-5f); });
    time("norm_backward (accumulate dx)",
         [&] { cuda().norm_backward(n.kind, y, x, w, m, rstd, out, dw, dbias, true); });
  }
}

// AdamW over one llama-3b block's group (100.7 M parameters: two norms, q|k|v, out, gate|up,
// down) as each recipe's step launches it: bf16 (an f32 master and its bf16 copy), fp8-current
// (the master is the compute weight; the four weights' amaxes recorded) and fp8 (each weight's
// FP8 copy written too), beside the plain update with none of these. Every variant also sums the
// squared gradients (the step's norm without clipping). Measured on an H100, all four stream at
// 2.93-2.97 TB/s, the FP8 copies and amax records costing instructions but no rate
// (bench/results/h100_adamw_variants_f595fdb.md, with ncu's view of each launch).
TEST_F(CudaOpTimings, DISABLED_AdamwVariants) {
  const int64_t C = 3072, kv = 1024, ffn = 8192;
  const int64_t rows[] = {C + 2 * kv, C, 2 * ffn, C}, cols[] = {C, C, C, ffn};
  int64_t n = 2 * C;  // the two norms' weights lead the group
  int64_t begin[4];
  for (int i = 0; i < 4; ++i) {
    begin[i] = n;
    n += rows[i] * cols[i];
  }
  std::printf("[ time  ] ---- llama-3b block group: %lld parameters ----\n", static_cast<long long>(n));
  Buffer master = random(Shape{n}, DType::f32, 1, -0.05f, 0.05f), grad = random(Shape{n}, DType::f32, 2, -1e-3f, 1e-3f);
  Buffer am = random(Shape{n}, DType::f32, 3, -1e-4f, 1e-4f), av = random(Shape{n}, DType::f32, 4, 0, 1e-8f);
  Buffer copy = random(Shape{n}, DType::bf16, 5), norm_sq = upload(cuda(), {0.0f}, Shape{1});
  std::vector<Buffer> keep;
  std::vector<AmaxSegment> amaxes;
  std::vector<WeightCastSegment> casts;
  for (int i = 0; i < 4; ++i) {
    casts.push_back(weight_cast_segment(cuda(), begin[i], begin[i] + rows[i] * cols[i], Shape{rows[i], cols[i]},
                                        448.0f / 0.08f, keep));
    amaxes.push_back({casts.back().begin, casts.back().end, casts.back().amax});
  }
  AdamWArgs args;
  args.learning_rate = 1e-4f;
  args.weight_decay = 0.1f;
  args.decay_count = n;
  args.grad_norm_output = AdamWArgs::NormOutput::overwrite;
  const Tensor none;
  time("adamw plain (f32 master only)", [&] { cuda().adamw(master, grad, am, av, none, norm_sq, args); });
  time("adamw bf16 (f32 master + bf16 copy)", [&] { cuda().adamw(master, grad, am, av, copy, norm_sq, args); });
  AdamWArgs current = args;
  current.weight_amaxes = amaxes;
  time("adamw fp8-current (4 amax records)", [&] { cuda().adamw(master, grad, am, av, none, norm_sq, current); });
  AdamWArgs delayed = args;
  delayed.weight_casts = casts;
  time("adamw fp8 (4 FP8 copies + amax records)", [&] { cuda().adamw(master, grad, am, av, none, norm_sq, delayed); });
}

// The LM head and its loss, one chunk of rows as Transformer::head runs it (logits_chunk_rows at the
// default budget), chunked (the logits GEMM, the cross-entropy kernel, the two gradient GEMMs) and
// as quack's linear cross-entropy (train.head_loss = quack-lce): the time of the chunk and of a
// step's chunks.
TEST_F(CudaOpTimings, DISABLED_HeadLoss) {
  if (!quack_gemm::lce_carried()) GTEST_SKIP() << "built without quack's linear cross-entropy";
  struct HeadShape {
    const char* name;
    int64_t rows, chunk, hidden, vocab, valid;
  };
  const HeadShape shapes[] = {{"gpt2-124m 64x1024", 65536, 8192, 768, 50304, 50257},
                              {"gpt2-1.5b 16x1024", 16384, 8192, 1600, 50304, 50257},
                              {"llama-1b 8x2048", 16384, 8192, 2048, 32000, 32000},
                              {"llama-3b 4x2048", 8192, 4096, 3072, 128256, 128256}};
  BackendOptions fused_options;
  fused_options.gemm_autotune = true;
  fused_options.head_loss_quack = true;
  BackendOptions chunked_options;
  chunked_options.gemm_autotune = true;
  for (const HeadShape& h : shapes) {
    double ms[2] = {0, 0};
    for (int fused = 0; fused < 2; ++fused) {
      cuda_ = create_backend("cuda", fused ? fused_options : chunked_options);
      const DType bf = DType::bf16;
      Buffer x = random(Shape{h.chunk, h.hidden}, bf, 1), w = random(Shape{h.vocab, h.hidden}, bf, 2, -0.05f, 0.05f);
      std::vector<int32_t> ids(static_cast<size_t>(h.chunk));
      for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 7919) % h.valid);
      Buffer targets = upload_i32(cuda(), ids, Shape{h.chunk});
      Buffer logits = cuda().allocate("logits", Shape{h.chunk, h.vocab}, bf, Lifetime::scratch);
      Buffer losses = cuda().allocate("losses", Shape{h.chunk}, DType::f32, Lifetime::scratch);
      Buffer dx = cuda().allocate("dx", Shape{h.chunk, h.hidden}, bf, Lifetime::scratch);
      Buffer dw = random(Shape{h.vocab, h.hidden}, DType::f32, 3);
      const HeadLossChunk c{.x = x, .weight = w, .targets = targets, .losses = losses, .logits = logits,
                            .valid_vocab = h.valid, .grad_scale = 1e-5f, .dx = dx, .dweight = dw,
                            .accumulate = true};
      EXPECT_EQ(cuda().fuses_head_loss(c), fused == 1) << h.name;
      for (int i = 0; i < 3; ++i) cuda().head_loss(c);  // the GEMM autotune's trials, then warm
      const uint64_t start = cuda().record_timestamp();
      for (int i = 0; i < kRepeats; ++i) cuda().head_loss(c);
      const uint64_t end = cuda().record_timestamp();
      ms[fused] = cuda().elapsed_ms(start, end) / kRepeats;
    }
    const double chunks = static_cast<double>(h.rows) / static_cast<double>(h.chunk);
    std::printf("[ time  ] head_loss %-20s %5lld-row chunk, hidden %4lld, V%lld: chunked %8.3f ms, quack-lce %8.3f ms "
                "(%.3fx); a step's %g chunks %7.2f -> %7.2f ms\n",
                h.name, static_cast<long long>(h.chunk), static_cast<long long>(h.hidden),
                static_cast<long long>(h.vocab), ms[0], ms[1], ms[0] / ms[1], chunks, chunks * ms[0], chunks * ms[1]);
  }
}

// GPT-2's two GELU GEMMs a layer at the step's shapes, burst-timed: the plain GEMM of the same
// size (the floor: no epilogue), cuBLASLt's GELU_AUX_BIAS / DGELU and quack's
// (train.gemm_kernels = cublaslt+quack-gelu), each with the GEMM autotune on.
TEST_F(CudaOpTimings, DISABLED_GeluGemms) {
  if (!quack_gemm::gelu_carried()) GTEST_SKIP() << "built without quack's GELU GEMMs";
  struct GeluShape {
    const char* name;
    int64_t rows, model, ffn;
  };
  const GeluShape shapes[] = {{"gpt2-124m 64x1024", 65536, 768, 3072}, {"gpt2-1.5b 16x1024", 16384, 1600, 6400}};
  const char* paths[] = {"plain GEMM", "cuBLASLt", "quack"};
  for (const GeluShape& g : shapes) {
    double ms[3][3] = {};
    for (int path = 0; path < 3; ++path) {
      BackendOptions options;
      options.gemm_autotune = true;
      options.gemm_quack_gelu = path == 2;
      cuda_ = create_backend("cuda", options);
      const DType bf = DType::bf16;
      Buffer x = random(Shape{g.rows, g.model}, bf, 1), up = random(Shape{g.ffn, g.model}, bf, 2, -0.05f, 0.05f);
      Buffer bias = random(Shape{g.ffn}, bf, 3), down = random(Shape{g.model, g.ffn}, bf, 4, -0.05f, 0.05f);
      Buffer pre = cuda().allocate("pre", Shape{g.rows, g.ffn}, bf, Lifetime::scratch);
      Buffer out = cuda().allocate("out", Shape{g.rows, g.ffn}, bf, Lifetime::scratch);
      Buffer dx = cuda().allocate("dx", Shape{g.rows, g.ffn}, bf, Lifetime::scratch);
      const GemmEpilogue fwd_epilogue = path == 0 ? GemmEpilogue::none : GemmEpilogue::gelu_aux_bias;
      const GemmEpilogue bwd_epilogue = path == 0 ? GemmEpilogue::none : GemmEpilogue::dgelu;
      const GemmArgs fwd{.role = GemmRole::forward, .a = x, .b = up, .out = out, .epilogue = fwd_epilogue,
                         .bias = bias, .aux = path == 0 ? Tensor() : pre.tensor()};
      const GemmArgs bwd{.role = GemmRole::backward_input, .a = x, .b = down, .out = dx, .epilogue = bwd_epilogue,
                         .aux = path == 0 ? Tensor() : pre.tensor()};
      // The backward with the up projection's bias gradient (f32, added to): on the cuBLASLt
      // backend the DGELU GEMM then the column-sum op; with quack's, its DGELU GEMM's partials.
      Buffer dbias = cuda().allocate("dbias", Shape{g.ffn}, DType::f32, Lifetime::scratch);
      GemmArgs bwd_bias = bwd;
      bwd_bias.bias_gradient = dbias;
      bwd_bias.bias_gradient_accumulate = true;
      const GemmArgs* args[] = {&fwd, &bwd, &bwd_bias};
      for (int dir = 0; dir < 3; ++dir) {
        if (dir == 2 && path == 0) continue;
        for (int i = 0; i < 3; ++i) cuda().gemm(*args[dir]);  // the autotune's trials, then warm
        const uint64_t start = cuda().record_timestamp();
        for (int i = 0; i < kRepeats; ++i) cuda().gemm(*args[dir]);
        const uint64_t end = cuda().record_timestamp();
        ms[dir][path] = cuda().elapsed_ms(start, end) / kRepeats;
      }
    }
    std::printf("[ time  ] gelu_gemm %-20s backward with the bias gradient %lldx%lld->%lld: cuBLASLt + column sum "
                "%.3f ms, quack %.3f ms (quack %.3fx)\n",
                g.name, static_cast<long long>(g.rows), static_cast<long long>(g.model), static_cast<long long>(g.ffn),
                ms[2][1], ms[2][2], ms[2][1] / ms[2][2]);
    for (int dir = 0; dir < 2; ++dir)
      std::printf("[ time  ] gelu_gemm %-20s %s %lldx%lld->%lld: %s %.3f ms, %s %.3f ms, %s %.3f ms (quack %.3fx "
                  "cuBLASLt)\n",
                  g.name, dir == 0 ? "forward " : "backward", static_cast<long long>(g.rows),
                  static_cast<long long>(g.model), static_cast<long long>(g.ffn), paths[0], ms[dir][0], paths[1],
                  ms[dir][1], paths[2], ms[dir][2], ms[dir][1] / ms[dir][2]);
  }
}

}  // namespace
}  // namespace mxtrain::test
