#include "mxtrain/model/transformer.hpp"

#include <algorithm>
#include <cmath>
#include <string>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

int64_t logits_chunk_rows(int64_t padded_vocab, DType dtype, int64_t asked, int64_t rows) {
  int64_t chunk = asked;
  if (chunk == 0) {
    constexpr int64_t kBudget = int64_t{1} << 30, kStep = 256, kMost = 8192;
    const int64_t row_bytes = std::max<int64_t>(1, static_cast<int64_t>(dtype_bytes(dtype, static_cast<size_t>(padded_vocab))));
    chunk = std::clamp<int64_t>(kBudget / row_bytes / kStep * kStep, kStep, kMost);
  }
  return std::min(chunk, rows);
}

Transformer::Transformer(const ModelConfig& config, const TransformerOptions& options, Backend& backend,
                         ParameterStore& params)
    : config_(config), options_(options), backend_(backend), params_(params), layout_(params.layout()),
      linears_(options.linear, backend, config.layers) {
  config_.validate();
  MXTRAIN_ASSERT(options_.logits_chunk_tokens >= 0, "logits_chunk_tokens must not be negative");
}

void Transformer::check_batch(int64_t rows) const {
  const int64_t C = config_.hidden;
  linears_.check_shapes(rows, C, config_.qkv_cols(), LinearKind::qkv);
  linears_.check_shapes(rows, C, C, LinearKind::out);
  linears_.check_shapes(rows, C, config_.up_cols(), LinearKind::up);
  linears_.check_shapes(rows, config_.ffn_hidden, C, LinearKind::down);
}

Transformer::Keep Transformer::keep_for(RecomputeMode mode) {
  switch (mode) {
    case RecomputeMode::none: return Keep::all;
    case RecomputeMode::selective: return Keep::selective;
    case RecomputeMode::full: return Keep::input_only;
  }
  return Keep::all;
}

Buffer Transformer::activation(const char* what, int64_t layer, int64_t cols, Lifetime lifetime) {
  std::string name = layer >= 0 ? "layers." + std::to_string(layer) + "." + what : std::string(what);
  return backend_.allocate(name, Shape{rows_, cols}, options_.activation_dtype, lifetime);
}

Tensor Transformer::produced(int64_t cols) const {
  return Tensor(nullptr, Shape{rows_, cols}, options_.activation_dtype, backend_.device());
}

CastProducer Transformer::norm_producer(int64_t l, BlockNorm which, const Tensor& input, const Saved& s) {
  const LayerParamIndex& p = layout_.layer;
  const bool attn = which == BlockNorm::attention;
  return {.op = CastProducer::Op::norm_forward,
          .norm = norm_kind(),
          .input = input,
          .weight = w(l, attn ? p.attn_norm_weight : p.mlp_norm_weight),
          .bias = w(l, attn ? p.attn_norm_bias : p.mlp_norm_bias),
          .mean = attn ? s.mean1 : s.mean2,
          .rstd = attn ? s.rstd1 : s.rstd2,
          .eps = config_.norm_eps};
}

bool Transformer::fuses_recomputed_norm(int64_t l, const Tensor& normed, LinearKind consumer,
                                        const Tensor& rstd) const {
  return !normed.defined() && rstd.defined() && !linears_.has_saved_input(l, consumer) && linears_.fuses_producers(l);
}

Buffer Transformer::statistics(const char* what, int64_t layer) {
  std::string name = layer >= 0 ? "layers." + std::to_string(layer) + "." + what : std::string(what);
  return backend_.allocate(name, Shape{rows_}, DType::f32, Lifetime::activation);
}

AttentionShape Transformer::attention_shape() const {
  AttentionShape shape;
  shape.batch = batch_;
  shape.seq = seq_;
  shape.heads = config_.heads;
  shape.kv_heads = config_.kv_heads;
  shape.head_dim = config_.head_dim();
  shape.softmax_scale = 1.0f / std::sqrt(static_cast<float>(config_.head_dim()));
  shape.position_offset = cache_ != nullptr ? cache_->length : 0;
  return shape;
}

Tensor Transformer::w(int64_t layer, int index) {
  return index < 0 ? Tensor() : params_.weight(layout_.layer_group(layer), index);
}

Transformer::GradPair Transformer::grads(int group, int weight, int bias) {
  const GradTarget w = params_.grad_target(group, weight);
  GradPair pair{w.tensor, Tensor(), w.accumulate};
  if (bias >= 0) {
    const GradTarget b = params_.grad_target(group, bias);
    MXTRAIN_ASSERT(b.accumulate == w.accumulate, "parameters %d and %d of group %d were written apart", weight, bias,
                   group);
    pair.bias = b.tensor;
  }
  return pair;
}

void Transformer::embed_forward(const Tensor& tokens, const Tensor& x0) {
  const int g = layout_.embed_group;
  params_.acquire(g, Pass::forward);
  Tensor positions = layout_.position_table >= 0 ? params_.weight(g, layout_.position_table) : Tensor();
  if (positions.defined() && cache_ != nullptr) {
    // Generation: the new tokens' rows of the position table.
    const int64_t first = cache_->length;
    MXTRAIN_REQUIRE(first + seq_ <= positions.rows(), config,
                  strf("position %lld is past the model's %lld learned positions", static_cast<long long>(first + seq_ - 1),
                       static_cast<long long>(positions.rows())),
                  "generate within model.max_seq_len tokens");
    positions = positions.slice_rows(first, first + seq_);
  }
  backend_.embedding_forward(tokens, params_.weight(g, layout_.token_table), positions, x0, seq_);
  params_.release(g, Pass::forward);
}

void Transformer::embed_backward(const Tensor& tokens, const Tensor& dres) {
  const int g = layout_.embed_group;
  params_.acquire(g, Pass::backward);
  Tensor dpositions = layout_.position_table >= 0 ? params_.grad(g, layout_.position_table) : Tensor();
  backend_.embedding_backward(tokens, dres, params_.grad(g, layout_.token_table), dpositions, seq_);
  params_.release(g, Pass::backward);
  params_.grads_ready(g);
}

void Transformer::layer_forward(int64_t l, const Tensor& x, const Tensor& x_out, Saved& s, Keep keep) {
  const LayerParamIndex& p = layout_.layer;
  const NormKind norm = norm_kind();
  const AttentionShape shape = attention_shape();
  const bool layer_norm = norm == NormKind::layer;
  const bool keep_all = keep == Keep::all;
  const bool keep_most = keep != Keep::input_only;
  // Per-tensor FP8 blocks keep their linears' inputs as the FP8 copies the weight gradients read
  // (the recipe's saved inputs) instead of the norm outputs and the MLP activation in BF16.
  const bool save_inputs = keep_all && linears_.saves_inputs(l);
  const bool keep_inputs = keep_all && !save_inputs;

  // Under delayed FP8 scaling (LinearRecipe::fuses_producers) the norms feed their linears
  // through the casts: the norm kernel saves only its statistics (and the residual sum), and the
  // cast computes the norm's output from them as it reads the input — the output is never
  // written in BF16 and read back.
  const bool fused_norms = !keep_inputs && linears_.fuses_producers(l);

  // Attention half.
  if (!fused_norms)
    s.norm1 = activation("attn_norm", l, config_.hidden, keep_inputs ? Lifetime::activation : Lifetime::scratch);
  if (layer_norm) s.mean1 = statistics("attn_norm.mean", l);
  s.rstd1 = statistics("attn_norm.rstd", l);
  // (Under current FP8 scaling the norm and activation kernels record the amaxes of the tensors
  // the linears cast next: LinearRecipe::amax_record.)
  backend_.norm_forward(norm, x, w(l, p.attn_norm_weight), w(l, p.attn_norm_bias), s.norm1, s.mean1, s.rstd1,
                        config_.norm_eps, linears_.amax_record(l, LinearKind::qkv, false, s.norm1));
  s.qkv = activation("qkv", l, config_.qkv_cols(), Lifetime::activation);
  linears_.gemm(l, LinearKind::qkv, {.role = GemmRole::forward, .a = fused_norms ? produced(config_.hidden) : s.norm1,
                                     .b = w(l, p.qkv_weight), .out = s.qkv, .bias = w(l, p.qkv_bias)},
                {.save_input = save_inputs,
                 .producer = fused_norms ? norm_producer(l, BlockNorm::attention, x, s) : CastProducer{}});
  if (!keep_inputs) s.norm1.reset();
  if (config_.family == ModelFamily::llama) backend_.rope_forward(s.qkv, shape, config_.rope());
  s.attn = activation("attn", l, config_.hidden, Lifetime::activation);
  if (cache_ != nullptr) {
    backend_.attention_cached(s.qkv, cache_->keys[static_cast<size_t>(l)], cache_->values[static_cast<size_t>(l)], s.attn,
                              shape);
  } else {
    s.lse = backend_.allocate("layers." + std::to_string(l) + ".lse", Shape{batch_, config_.heads, seq_}, DType::f32,
                              Lifetime::activation);
    backend_.attention_forward(s.qkv, s.attn, s.lse, shape);
  }
  {
    s.mid = activation("mid", l, config_.hidden, Lifetime::activation);
    if (!fused_norms)
      s.norm2 = activation("mlp_norm", l, config_.hidden, keep_inputs ? Lifetime::activation : Lifetime::scratch);
    if (layer_norm) s.mean2 = statistics("mlp_norm.mean", l);
    s.rstd2 = statistics("mlp_norm.rstd", l);
    if (!linears_.quantized(l) || linears_.saves_inputs(l)) {
      // The first residual add rides on the out projection's GEMM (mid = attn · Wᵀ + b + x, one
      // rounding; per-tensor FP8 GEMMs too, as the down projection's), so the norm reads mid
      // alone: one tensor's pass less than a separate add, or than the fused add-norm.
      linears_.gemm(l, LinearKind::out, {.role = GemmRole::forward, .a = s.attn, .b = w(l, p.out_weight), .out = s.mid,
                                         .bias = w(l, p.out_bias), .residual = x}, {.save_input = save_inputs});
      backend_.norm_forward(norm, s.mid, w(l, p.mlp_norm_weight), w(l, p.mlp_norm_bias), s.norm2, s.mean2, s.rstd2,
                            config_.norm_eps, linears_.amax_record(l, LinearKind::up, false, s.norm2));
    } else {
      // The block formats (MXFP8, NVFP4): the add rides on the norm (add_norm_forward reads x
      // and the projection, writes mid and the norm).
      Buffer projected = activation("attn_proj", l, config_.hidden, Lifetime::scratch);
      linears_.gemm(l, LinearKind::out, {.role = GemmRole::forward, .a = s.attn, .b = w(l, p.out_weight),
                                         .out = projected, .bias = w(l, p.out_bias)}, {.save_input = save_inputs});
      backend_.add_norm_forward(norm, x, projected, s.mid, w(l, p.mlp_norm_weight), w(l, p.mlp_norm_bias), s.norm2,
                                s.mean2, s.rstd2, config_.norm_eps,
                                linears_.amax_record(l, LinearKind::up, false, s.norm2));
    }
  }

  // MLP half.
  s.up = activation("mlp_up", l, config_.up_cols(), Lifetime::activation);
  // GPT-2's GELU rides on the up GEMM (cuBLASLt's GELU_AUX_BIAS epilogue: one pass over the FFN
  // activation less; 0.51-0.57 ms against 0.44 + 0.13 apart in a GPT-2 1.5B 16x1024 step on an
  // H200) where the activation is kept for backward. The epilogue applies GELU to the
  // f32 sum before rounding, so GELU recomputed from the stored 16-bit pre-activation can differ
  // in the last bit: layers that recompute the activation, and deterministic runs (bit-identical
  // gradients under every recompute policy), run the GELU kernel instead.
  const bool gelu_on_gemm = config_.family != ModelFamily::llama && keep_inputs && !options_.deterministic;
  // SwiGLU rides on the up GEMM likewise where the backend has a fused kernel for it
  // (Backend::gemm_fuses_swiglu: quack's gated GEMM on an H200, train.gemm_kernels): the GEMM
  // writes the interleaved gate/up pre-activation for backward and silu(gate) · up beside it,
  // from the f32 product — the same exceptions as GELU's for the same reason.
  // (quack's gated epilogue takes no bias: a llama with model.bias runs the two apart.)
  const bool swiglu_on_gemm = config_.family == ModelFamily::llama && keep_inputs && !options_.deterministic &&
                              !linears_.quantized(l) && !w(l, p.up_bias).defined() &&
                              backend_.gemm_fuses_swiglu(s.norm2.tensor().dtype, config_.hidden, config_.ffn_hidden);
  if (gelu_on_gemm || swiglu_on_gemm) {
    s.act = activation("mlp_act", l, config_.ffn_hidden, Lifetime::activation);
    linears_.gemm(l, LinearKind::up,
                  {.role = GemmRole::forward, .a = s.norm2, .b = w(l, p.up_weight), .out = s.act,
                   .epilogue = gelu_on_gemm ? GemmEpilogue::gelu_aux_bias : GemmEpilogue::swiglu_aux,
                   .bias = w(l, p.up_bias), .aux = s.up},
                  {.out_amax = linears_.amax_record(l, LinearKind::down, false, s.act)});
  } else {
    linears_.gemm(l, LinearKind::up, {.role = GemmRole::forward, .a = fused_norms ? produced(config_.hidden) : s.norm2,
                                      .b = w(l, p.up_weight), .out = s.up, .bias = w(l, p.up_bias)},
                  {.save_input = save_inputs,
                   .producer = fused_norms ? norm_producer(l, BlockNorm::mlp, s.mid, s) : CastProducer{}});
  }
  if (!keep_inputs) s.norm2.reset();
  if (!x_out.defined() && !keep_all) {
    // The rerun of full recomputation (no output wanted): the activation would be dropped
    // unused, as backward recomputes it right before the down projection.
    if (!keep_most) s = Saved{};
    return;
  }
  // Under delayed FP8 scaling SwiGLU runs inside the down projection's input cast
  // (LinearRecipe::fuses_producers) where nothing else reads the activation: it is never
  // written in BF16 and read back.
  const bool fused_act = config_.family == ModelFamily::llama && !keep_inputs && x_out.defined() &&
                         linears_.fuses_producers(l);
  Tensor act = produced(config_.ffn_hidden);
  CastProducer act_producer;
  if (fused_act) {
    act_producer = {.op = CastProducer::Op::swiglu_forward, .gate_up = s.up};
  } else if (!gelu_on_gemm && !swiglu_on_gemm) {
    s.act = activation("mlp_act", l, config_.ffn_hidden, keep_inputs ? Lifetime::activation : Lifetime::scratch);
    const Tensor act_amax = linears_.amax_record(l, LinearKind::down, false, s.act);
    if (config_.family == ModelFamily::llama) {
      backend_.swiglu_forward(s.up, s.act, act_amax);
    } else {
      backend_.gelu_forward(s.up, s.act, act_amax);
    }
  }
  if (s.act.defined()) act = s.act;
  // The second residual add rides on the down GEMM (out = act · Wᵀ + b + mid).
  if (x_out.defined()) {
    linears_.gemm(l, LinearKind::down, {.role = GemmRole::forward, .a = act, .b = w(l, p.down_weight), .out = x_out,
                                        .bias = w(l, p.down_bias), .residual = s.mid},
                  {.save_input = save_inputs, .producer = act_producer});
  }
  if (!keep_inputs) s.act.reset();
  if (!keep_most) s = Saved{};
}

void Transformer::layer_backward(int64_t l, const Tensor& x, Saved& s, const Tensor& dres, RecomputeMode mode) {
  const LayerParamIndex& p = layout_.layer;
  const NormKind norm = norm_kind();
  const AttentionShape shape = attention_shape();
  const bool llama = config_.family == ModelFamily::llama;

  if (mode == RecomputeMode::full) {
    PhaseScope scope(backend_, Phase::recompute);
    layer_forward(l, x, Tensor(), s, Keep::selective);
  }
  // Selective and full keep only the block's expensive outputs; the norms and the MLP
  // activation are recomputed right before their single use and dropped right after.
  auto recompute = [&](Buffer& buffer, LinearKind consumer, auto&& compute) {
    if (buffer.defined() || linears_.has_saved_input(l, consumer)) return;
    PhaseScope scope(backend_, Phase::recompute);
    compute();
  };

  // MLP: down projection. Under delayed FP8 scaling a SwiGLU that backward must recompute runs
  // inside the weight gradient's input cast instead (LinearRecipe::fuses_producers): the
  // activation is not written in BF16 and read back.
  const bool fused_act = llama && !s.act.defined() && !linears_.has_saved_input(l, LinearKind::down) &&
                         linears_.fuses_producers(l);
  const GradPair d_down = dw(l, p.down_weight, p.down_bias);
  const GradPair dup_params = dw(l, p.up_weight, p.up_bias);
  // Under delayed FP8 scaling SwiGLU's backward runs inside the up projection's gradient cast
  // (both copies, one pass; LinearRecipe::fuses_producers): the gradient of gate_up is never
  // written in BF16 and read back, and gate_up and dact live until that cast instead.
  const bool fused_dup = llama && linears_.fuses_producers(l) && !dup_params.bias.defined();
  // And where the activation is recomputed too, that cast also writes the activation's copy for
  // the down projection's weight gradient, which then runs after it: gate_up is read once in
  // this backward instead of twice (the down projection's input gradient goes first, and its
  // cast keeps the gradient's columnwise copy for the weight gradient).
  const bool act_with_dup = fused_act && fused_dup && !d_down.bias.defined();
  CastProducer act_producer;
  Tensor act = produced(config_.ffn_hidden);
  if (fused_act) {
    act_producer = {.op = CastProducer::Op::swiglu_forward, .gate_up = s.up};
  } else {
    recompute(s.act, LinearKind::down, [&] {
      s.act = activation("mlp_act", l, config_.ffn_hidden, Lifetime::scratch);
      if (llama) backend_.swiglu_forward(s.up, s.act); else backend_.gelu_forward(s.up, s.act);
    });
    if (s.act.defined()) act = s.act;
  }
  // The down projection's bias gradient (the column sums of dres as it is here) and the
  // attention output projection's (those of dres after the MLP norm's backward adds its part)
  // ride on that norm backward's pass over dres (DxColumnSums), not on the weight gradients.
  const GradPair d_out = dw(l, p.out_weight, p.out_bias);
  auto down_weight_gradient = [&](const CastProducer& input_producer) {
    linears_.gemm(l, LinearKind::down, {.role = GemmRole::backward_weight, .a = dres, .b = act, .out = d_down.weight,
                                        .accumulate = d_down.accumulate},
                  {.input_producer = input_producer});
  };
  if (!act_with_dup) down_weight_gradient(act_producer);
  s.act.reset();
  {
    Buffer dup, dact;
    Tensor dup_operand = produced(config_.up_cols());
    CastProducer dup_producer;
    if (!fused_dup) {
      dup = activation("mlp_up.grad", l, config_.up_cols(), Lifetime::scratch);
      dup_operand = dup;
    }
    const Tensor dup_amax = fused_dup ? Tensor() : linears_.amax_record(l, LinearKind::up, true, dup);
    const bool up_bias_in_dgelu = !llama && dup_params.bias.defined() && !linears_.quantized(l) &&
                                  !dup_amax.defined() &&
                                  backend_.gemm_fuses_dgelu_bias_gradient(dup.tensor().dtype, config_.hidden,
                                                                          config_.ffn_hidden);
    if (llama) {
      dact = activation("mlp_act.grad", l, config_.ffn_hidden, Lifetime::scratch);
      linears_.gemm(l, LinearKind::down, {.role = GemmRole::backward_input, .a = dres, .b = w(l, p.down_weight),
                                          .out = dact}, {.keep_gradient_columnwise = act_with_dup});
      if (fused_dup) {
        dup_producer = {.op = CastProducer::Op::swiglu_backward, .gate_up = s.up, .dout = dact};
        if (act_with_dup) linears_.produce_input_copy(l, LinearKind::down, act, dup_producer);
      } else {
        backend_.swiglu_backward(dact, s.up, dup, dup_amax);
        dact.reset();
      }
    } else {
      // GELU's backward rides on the down projection's input-gradient GEMM (the DGELU epilogue,
      // on the f32 product: 0.52 ms for GEMM and GELU against 0.44 + 0.18 apart in a GPT-2 1.5B
      // 16x1024 step on an H200). It reads only the pre-activation, which every recompute policy
      // reproduces bit for bit, so it needs no deterministic exception. (DGELU_BGRAD, which
      // would also sum the bias gradient, measured 1.45 ms: the column-sum kernel stays.) Where
      // the backend sums it inside the GEMM (quack's DGELU GEMM with the bias partials on an
      // H100/H200), the up projection's bias gradient rides on it instead of a column-sum pass
      // over dup after the weight gradient.
      linears_.gemm(l, LinearKind::down, {.role = GemmRole::backward_input, .a = dres, .b = w(l, p.down_weight),
                                          .out = dup, .epilogue = GemmEpilogue::dgelu,
                                          .bias_gradient = up_bias_in_dgelu ? dup_params.bias : Tensor(),
                                          .bias_gradient_accumulate = up_bias_in_dgelu && dup_params.accumulate,
                                          .aux = s.up},
                    {.out_amax = dup_amax});
    }
    if (!fused_dup) s.up.reset();
    // MLP: up projection and norm. A norm that backward must recompute runs inside the weight
    // gradient's input cast instead, from the statistics the forward kept.
    const bool fused_norm2 = fuses_recomputed_norm(l, s.norm2, LinearKind::up, s.rstd2);
    if (!fused_norm2) {
      recompute(s.norm2, LinearKind::up, [&] {
        s.norm2 = activation("mlp_norm", l, config_.hidden, Lifetime::scratch);
        backend_.norm_forward(norm, s.mid, w(l, p.mlp_norm_weight), w(l, p.mlp_norm_bias), s.norm2, s.mean2,
                              s.rstd2, config_.norm_eps);
      });
    }
    linears_.gemm(l, LinearKind::up, {.role = GemmRole::backward_weight, .a = dup_operand,
                                      .b = fused_norm2 ? produced(config_.hidden) : s.norm2,
                                      .out = dup_params.weight, .accumulate = dup_params.accumulate,
                                      .bias_gradient = up_bias_in_dgelu ? Tensor() : dup_params.bias},
                  {.producer = dup_producer,
                   .input_producer = fused_norm2 ? norm_producer(l, BlockNorm::mlp, s.mid, s) : CastProducer{}});
    s.norm2.reset();
    // The down projection's weight gradient from the copies the casts above made.
    if (act_with_dup) down_weight_gradient(CastProducer{});
    // The cast above made both copies of the gradient (the backward_input below takes the
    // stashed rowwise one): what produced it is no longer needed.
    dact.reset();
    s.up.reset();
    Buffer dnorm2 = activation("mlp_norm.grad", l, config_.hidden, Lifetime::scratch);
    linears_.gemm(l, LinearKind::up, {.role = GemmRole::backward_input, .a = dup_operand, .b = w(l, p.up_weight),
                                      .out = dnorm2}, {.producer = dup_producer});
    dup.reset();
    const GradPair dnorm = dw(l, p.mlp_norm_weight, p.mlp_norm_bias);
    backend_.norm_backward(norm, dnorm2, s.mid, w(l, p.mlp_norm_weight), s.mean2, s.rstd2, dres, dnorm.weight,
                           dnorm.bias, true, dnorm.accumulate, linears_.amax_record(l, LinearKind::out, true, dres),
                           {.in = d_down.bias, .out = d_out.bias, .accumulate_in = d_down.accumulate,
                            .accumulate_out = d_out.accumulate});
  }
  s.mid.reset();
  s.mean2.reset();
  s.rstd2.reset();

  // Attention: output projection, attention, QKV projection and norm.
  linears_.gemm(l, LinearKind::out, {.role = GemmRole::backward_weight, .a = dres, .b = s.attn, .out = d_out.weight,
                                     .accumulate = d_out.accumulate});
  {
    Buffer dattn = activation("attn.grad", l, config_.hidden, Lifetime::scratch);
    linears_.gemm(l, LinearKind::out, {.role = GemmRole::backward_input, .a = dres, .b = w(l, p.out_weight),
                                       .out = dattn});
    Buffer dqkv = activation("qkv.grad", l, config_.qkv_cols(), Lifetime::scratch);
    backend_.attention_backward(dattn, s.qkv, s.attn, s.lse, dqkv, shape);
    dattn.reset();
    s.qkv.reset();
    s.attn.reset();
    s.lse.reset();
    // Under delayed FP8 scaling RoPE's backward runs inside the QKV projection's gradient cast
    // (both copies, one pass): the rotated gradient is never written in BF16 and read back.
    const GradPair dqkv_params = dw(l, p.qkv_weight, p.qkv_bias);
    const bool fused_rope =
        llama && linears_.fuses_producers(l) && !dqkv_params.bias.defined() && config_.head_dim() % 16 == 0;
    Tensor dqkv_operand = dqkv;
    CastProducer rope_producer;
    if (fused_rope) {
      dqkv_operand = produced(config_.qkv_cols());
      rope_producer = {.op = CastProducer::Op::rope_backward, .input = dqkv, .shape = shape, .rope = config_.rope()};
    } else if (llama) {
      backend_.rope_backward(dqkv, shape, config_.rope(), linears_.amax_record(l, LinearKind::qkv, true, dqkv));
    }
    // GPT-2's QKV bias gradient from what softmax attention is, instead of column sums over all
    // of dqkv ([tokens, q|k|v]: 302 MB a layer at gpt2-124m 64x1024): the keys' part is zero (a
    // bias on every key adds q_i·b to each logit of query row i alike, and softmax does not see
    // a constant added to a row; no RoPE rotates the bias per position), and the values' part is
    // Σ_t dV_t = Σ_i dO_i (each row of the attention probabilities sums to one) = (Σ_i dres_i)·Wo,
    // the output projection's bias gradient (summed above by the MLP norm's backward) times Wo.
    // Only the queries' part is a column sum, over a third of dqkv (Backend::qkv_bias_gradient).
    // The values' part is overwritten each micro-batch from the out bias gradient summed so far,
    // which is the step's sum at the last (Wo is fixed within a step): the two gradients must
    // accumulate alike.
    const bool qkv_bias_from_attention =
        !llama && dqkv_params.bias.defined() && d_out.bias.defined() && config_.kv_heads == config_.heads &&
        !linears_.quantized(l) && dqkv_params.accumulate == d_out.accumulate &&
        d_out.bias.dtype == dqkv_params.bias.dtype;
    const bool fused_norm1 = fuses_recomputed_norm(l, s.norm1, LinearKind::qkv, s.rstd1);
    if (!fused_norm1) {
      recompute(s.norm1, LinearKind::qkv, [&] {
        s.norm1 = activation("attn_norm", l, config_.hidden, Lifetime::scratch);
        backend_.norm_forward(norm, x, w(l, p.attn_norm_weight), w(l, p.attn_norm_bias), s.norm1, s.mean1,
                              s.rstd1, config_.norm_eps);
      });
    }
    linears_.gemm(l, LinearKind::qkv, {.role = GemmRole::backward_weight, .a = dqkv_operand,
                                       .b = fused_norm1 ? produced(config_.hidden) : s.norm1,
                                       .out = dqkv_params.weight, .accumulate = dqkv_params.accumulate,
                                       .bias_gradient = qkv_bias_from_attention ? Tensor() : dqkv_params.bias},
                  {.producer = rope_producer,
                   .input_producer = fused_norm1 ? norm_producer(l, BlockNorm::attention, x, s) : CastProducer{}});
    s.norm1.reset();
    if (qkv_bias_from_attention)
      backend_.qkv_bias_gradient(dqkv, d_out.bias, w(l, p.out_weight), dqkv_params.bias, dqkv_params.accumulate);
    Buffer dnorm1 = activation("attn_norm.grad", l, config_.hidden, Lifetime::scratch);
    linears_.gemm(l, LinearKind::qkv, {.role = GemmRole::backward_input, .a = dqkv_operand, .b = w(l, p.qkv_weight),
                                       .out = dnorm1}, {.producer = rope_producer});
    dqkv.reset();
    const GradPair dnorm = dw(l, p.attn_norm_weight, p.attn_norm_bias);
    // dres is now the gradient the block below casts first (its down projection's).
    const Tensor dres_amax = l > 0 ? linears_.amax_record(l - 1, LinearKind::down, true, dres) : Tensor();
    backend_.norm_backward(norm, dnorm1, x, w(l, p.attn_norm_weight), s.mean1, s.rstd1, dres, dnorm.weight,
                           dnorm.bias, true, dnorm.accumulate, dres_amax);
  }
  s = Saved{};
}

void Transformer::head(const Tensor& x_final, const Tensor& targets, float grad_scale, const Tensor& loss_sum,
                       const Tensor& dres) {
  const bool training = dres.defined();
  const int g = layout_.head_group;
  const int embed = layout_.embed_group;
  const bool tied = layout_.head_weight < 0;
  const Pass pass = training ? Pass::backward : Pass::forward;
  params_.acquire(g, pass);
  if (tied) params_.acquire(embed, pass);
  Tensor head_weight = tied ? params_.weight(embed, layout_.token_table) : params_.weight(g, layout_.head_weight);
  // The head's weight gradient is first written by the first logits chunk (a tied table's too:
  // the head runs before the embedding's backward adds to it).
  GradTarget head_grad;
  if (training)
    head_grad = tied ? params_.grad_target(embed, layout_.token_table) : params_.grad_target(g, layout_.head_weight);
  Tensor norm_bias = layout_.final_norm_bias >= 0 ? params_.weight(g, layout_.final_norm_bias) : Tensor();

  Buffer normed = activation("final_norm", -1, config_.hidden, Lifetime::activation);
  Buffer mean = norm_kind() == NormKind::layer ? statistics("final_norm.mean", -1) : Buffer();
  Buffer rstd = statistics("final_norm.rstd", -1);
  backend_.norm_forward(norm_kind(), x_final, params_.weight(g, layout_.final_norm_weight), norm_bias, normed, mean,
                        rstd, config_.norm_eps);
  Buffer dnormed = training ? activation("final_norm.grad", -1, config_.hidden, Lifetime::scratch) : Buffer();
  Buffer losses = backend_.allocate("losses", Shape{rows_}, DType::f32, Lifetime::scratch);
  const int64_t chunk = logits_chunk_rows(config_.padded_vocab, options_.activation_dtype, options_.logits_chunk_tokens, rows_);
  Buffer logits = backend_.allocate("logits", Shape{chunk, config_.padded_vocab}, options_.activation_dtype,
                                    Lifetime::scratch);
  for (int64_t begin = 0; begin < rows_; begin += chunk) {
    const int64_t end = std::min(begin + chunk, rows_);
    Tensor rows_logits = logits.tensor().slice_rows(0, end - begin);
    Tensor rows_normed = normed.tensor().slice_rows(begin, end);
    HeadLossChunk c{.x = rows_normed,
                    .weight = head_weight,
                    .targets = targets.slice_flat(begin, Shape{end - begin}),
                    .losses = losses.tensor().slice_flat(begin, Shape{end - begin}),
                    .logits = rows_logits,
                    .valid_vocab = config_.vocab_size,
                    .grad_scale = grad_scale};
    if (training) {
      c.dx = dnormed.tensor().slice_rows(begin, end);
      c.dweight = head_grad.tensor;
      c.accumulate = head_grad.accumulate || begin > 0;
    }
    backend_.head_loss(c);
  }
  logits.reset();
  backend_.sum(losses, loss_sum, true);
  losses.reset();
  normed.reset();
  if (training) {
    PhaseScope scope(backend_, Phase::backward);
    const GradPair dnorm = grads(g, layout_.final_norm_weight, layout_.final_norm_bias);
    backend_.norm_backward(norm_kind(), dnormed, x_final, params_.weight(g, layout_.final_norm_weight), mean, rstd,
                           dres, dnorm.weight, dnorm.bias, false, dnorm.accumulate,
                           linears_.amax_record(config_.layers - 1, LinearKind::down, true, dres));
  }
  if (tied) params_.release(embed, pass);
  params_.release(g, pass);
  if (training) params_.grads_ready(g);
}

void Transformer::forward_backward(const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq,
                                   float grad_scale, const Tensor& loss_sum) {
  batch_ = batch;
  seq_ = seq;
  rows_ = batch * seq;
  MXTRAIN_ASSERT(tokens.numel() == rows_ && targets.numel() == rows_, "tokens %s for batch %lld x seq %lld",
                 tokens.describe().c_str(), static_cast<long long>(batch), static_cast<long long>(seq));
  const int64_t L = config_.layers;
  // inputs[l] is the residual stream entering block l; inputs[L] leaves the last block.
  std::vector<Buffer> inputs(static_cast<size_t>(L + 1));
  std::vector<Saved> saved(static_cast<size_t>(L));
  {
    PhaseScope scope(backend_, Phase::forward);
    inputs[0] = activation("embed.out", -1, config_.hidden, Lifetime::activation);
    embed_forward(tokens, inputs[0]);
    for (int64_t l = 0; l < L; ++l) {
      const int g = layout_.layer_group(l);
      params_.acquire(g, Pass::forward);
      inputs[static_cast<size_t>(l + 1)] = activation("out", l, config_.hidden, Lifetime::activation);
      layer_forward(l, inputs[static_cast<size_t>(l)], inputs[static_cast<size_t>(l + 1)], saved[static_cast<size_t>(l)],
                    keep_for(options_.recompute.mode_for_layer(l)));
      params_.release(g, Pass::forward);
    }
  }
  Buffer dres = activation("residual.grad", -1, config_.hidden, Lifetime::scratch);
  {
    PhaseScope scope(backend_, Phase::forward);  // the loss; its backward is marked inside
    head(inputs[static_cast<size_t>(L)], targets, grad_scale, loss_sum, dres);
  }
  inputs[static_cast<size_t>(L)].reset();
  PhaseScope scope(backend_, Phase::backward);
  for (int64_t l = L - 1; l >= 0; --l) {
    const int g = layout_.layer_group(l);
    params_.acquire(g, Pass::backward);
    layer_backward(l, inputs[static_cast<size_t>(l)], saved[static_cast<size_t>(l)], dres,
                   options_.recompute.mode_for_layer(l));
    params_.release(g, Pass::backward);
    params_.grads_ready(g);
    if (l > 0) inputs[static_cast<size_t>(l)].reset();
  }
  embed_backward(tokens, dres);
}

Buffer Transformer::forward_blocks(const Tensor& tokens, int64_t batch, int64_t seq) {
  batch_ = batch;
  seq_ = seq;
  rows_ = batch * seq;
  Buffer x = activation("embed.out", -1, config_.hidden, Lifetime::activation);
  embed_forward(tokens, x);
  for (int64_t l = 0; l < config_.layers; ++l) {
    const int g = layout_.layer_group(l);
    params_.acquire(g, Pass::forward);
    Buffer next = activation("out", l, config_.hidden, Lifetime::activation);
    Saved saved;
    layer_forward(l, x, next, saved, Keep::input_only);
    params_.release(g, Pass::forward);
    x = std::move(next);
  }
  return x;
}

void Transformer::forward_loss(const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq,
                               const Tensor& loss_sum) {
  PhaseScope scope(backend_, Phase::forward);
  Buffer x = forward_blocks(tokens, batch, seq);
  head(x, targets, 0.0f, loss_sum, Tensor());
}

void Transformer::head_logits(const Tensor& x, int64_t first_row, const Tensor& out) {
  const int g = layout_.head_group, embed = layout_.embed_group;
  const bool tied = layout_.head_weight < 0;
  params_.acquire(g, Pass::forward);
  if (tied) params_.acquire(embed, Pass::forward);
  const Tensor head_weight = tied ? params_.weight(embed, layout_.token_table) : params_.weight(g, layout_.head_weight);
  const Tensor norm_bias = layout_.final_norm_bias >= 0 ? params_.weight(g, layout_.final_norm_bias) : Tensor();
  Buffer normed = activation("final_norm", -1, config_.hidden, Lifetime::activation);
  Buffer mean = norm_kind() == NormKind::layer ? statistics("final_norm.mean", -1) : Buffer();
  Buffer rstd = statistics("final_norm.rstd", -1);
  backend_.norm_forward(norm_kind(), x, params_.weight(g, layout_.final_norm_weight), norm_bias, normed, mean, rstd,
                        config_.norm_eps);
  backend_.gemm({.role = GemmRole::forward, .a = normed.tensor().slice_rows(first_row, rows_), .b = head_weight,
                 .out = out});
  if (tied) params_.release(embed, Pass::forward);
  params_.release(g, Pass::forward);
}

void Transformer::forward_logits(const Tensor& tokens, int64_t batch, int64_t seq, int64_t first_row,
                                 const Tensor& out) {
  MXTRAIN_ASSERT(first_row >= 0 && first_row < batch * seq && out.rank() == 2 &&
                     out.size(0) == batch * seq - first_row && out.size(1) == config_.padded_vocab,
                 "forward_logits: rows from %lld of %lld into %s", static_cast<long long>(first_row),
                 static_cast<long long>(batch * seq), out.describe().c_str());
  PhaseScope scope(backend_, Phase::forward);
  Buffer x = forward_blocks(tokens, batch, seq);
  head_logits(x, first_row, out);
}

KvCache Transformer::make_kv_cache(int64_t capacity) {
  MXTRAIN_ASSERT(capacity > 0, "a key/value cache of %lld tokens", static_cast<long long>(capacity));
  KvCache cache;
  cache.capacity = capacity;
  const int64_t kv_cols = config_.kv_heads * config_.head_dim();
  for (int64_t l = 0; l < config_.layers; ++l) {
    const std::string prefix = "layers." + std::to_string(l) + ".";
    cache.keys.push_back(
        backend_.allocate(prefix + "k_cache", Shape{capacity, kv_cols}, options_.activation_dtype, Lifetime::activation));
    cache.values.push_back(
        backend_.allocate(prefix + "v_cache", Shape{capacity, kv_cols}, options_.activation_dtype, Lifetime::activation));
  }
  return cache;
}

void Transformer::forward_cached(const Tensor& tokens, KvCache& cache, const Tensor& out) {
  const int64_t count = tokens.numel();
  MXTRAIN_ASSERT(count > 0 && cache.length + count <= cache.capacity &&
                     static_cast<int64_t>(cache.keys.size()) == config_.layers && out.rank() == 2 && out.size(0) == 1 &&
                     out.size(1) == config_.padded_vocab,
                 "forward_cached: %lld tokens after %lld in a cache of %lld, logits %s", static_cast<long long>(count),
                 static_cast<long long>(cache.length), static_cast<long long>(cache.capacity), out.describe().c_str());
  PhaseScope scope(backend_, Phase::forward);
  cache_ = &cache;
  struct Detach {
    KvCache*& cache;
    ~Detach() { cache = nullptr; }
  } detach{cache_};
  Buffer x = forward_blocks(tokens, 1, count);
  head_logits(x, count - 1, out);
  cache.length += count;
}

}  // namespace mxtrain
