// The model step on the CPU oracle: recompute policies reproduce the gradients of `none` bit
// for bit; logits chunking does not change the loss; the loss gradient agrees with finite
// differences of the loss for a sample of parameters.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/model/transformer.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

struct Gradients {
  double loss = 0;
  std::vector<std::vector<float>> groups;
  // Delayed FP8 scaling: the amax histories after the step (what each cast recorded).
  std::vector<float> forward_history, backward_history;
};

// Fixed tokens and targets of `rows` positions on the backend.
void upload_batch(Backend& backend, const ModelConfig& config, int64_t rows, Buffer* tokens, Buffer* targets) {
  std::vector<int32_t> token_ids(static_cast<size_t>(rows)), target_ids(static_cast<size_t>(rows));
  for (size_t i = 0; i < token_ids.size(); ++i) {
    token_ids[i] = static_cast<int32_t>((i * 37 + 11) % config.vocab_size);
    target_ids[i] = static_cast<int32_t>((i * 53 + 5) % config.vocab_size);
  }
  *tokens = test::upload_i32(backend, token_ids, Shape{rows}, "tokens");
  *targets = test::upload_i32(backend, target_ids, Shape{rows}, "targets");
}

// One forward and backward of a 2 x 16 batch on the CPU; `observer` (if any) sees its ops.
Gradients run_step(const ModelConfig& config, const TransformerOptions& options, TraceObserver* observer = nullptr) {
  std::unique_ptr<Backend> backend = create_backend("cpu");
  backend->set_observer(observer);
  LocalParameterStore store(*backend, config, DType::f32, DType::f32);
  store.initialize(7);
  Transformer model(config, options, *backend, store);
  const int64_t batch = 2, seq = 16;
  Buffer t, y;
  upload_batch(*backend, config, batch * seq, &t, &y);
  Buffer loss = backend->allocate("loss", Shape{1}, DType::f32, Lifetime::scratch);
  backend->fill(loss, 0);
  model.forward_backward(t, y, batch, seq, 1.0f / (batch * seq), loss);
  Gradients result;
  result.loss = backend->read_scalar(loss) / (batch * seq);
  for (const ParamShard& shard : store.shards()) result.groups.push_back(test::download(*backend, shard.grad));
  if (options.linear.format == LinearFormat::fp8_delayed) {
    result.forward_history = test::download(*backend, model.linears().forward_history());
    result.backward_history = test::download(*backend, model.linears().backward_history());
  }
  backend->set_observer(nullptr);
  return result;
}

Gradients run_step(const ModelConfig& config, const std::string& policy, int64_t chunk = 8192,
                   LinearFormat format = LinearFormat::high_precision) {
  TransformerOptions options;
  options.recompute = RecomputePolicy::parse(policy);
  options.logits_chunk_tokens = chunk;
  options.linear.format = format;
  return run_step(config, options);
}

// Auto (0) keeps the logits chunk at or under 1 GiB, in multiples of 256 rows from 256 to 8192.
TEST(Transformer, LogitsChunkRowsAutoKeepsTheLogitsUnderAGibibyte) {
  EXPECT_EQ(logits_chunk_rows(32000, DType::bf16, 0, 16384), 8192);   // llama-1b: two chunks, as before
  EXPECT_EQ(logits_chunk_rows(128256, DType::bf16, 0, 8192), 4096);   // llama-3b: 1.05 GB a chunk, not 2.1
  EXPECT_EQ(logits_chunk_rows(128256, DType::f32, 0, 8192), 2048);
  EXPECT_EQ(logits_chunk_rows(128256, DType::bf16, 0, 1000), 1000);   // never more than the rows
  EXPECT_EQ(logits_chunk_rows(int64_t{1} << 24, DType::f32, 0, 8192), 256);
  EXPECT_EQ(logits_chunk_rows(128256, DType::bf16, 8192, 16384), 8192);  // asked: as asked
  for (int64_t vocab : {50304, 128256, 151936, 262144})
    EXPECT_LE(logits_chunk_rows(vocab, DType::bf16, 0, 1 << 20) * vocab * 2, int64_t{1} << 30) << vocab;
}

class RecomputeTest : public ::testing::TestWithParam<std::tuple<ModelFamily, std::string>> {};

TEST_P(RecomputeTest, GradientsAreBitIdenticalToNone) {
  auto [family, policy] = GetParam();
  ModelConfig config = test::small_model(family, 3);
  Gradients reference = run_step(config, "none");
  Gradients recomputed = run_step(config, policy);
  EXPECT_EQ(reference.loss, recomputed.loss);
  ASSERT_EQ(reference.groups.size(), recomputed.groups.size());
  for (size_t g = 0; g < reference.groups.size(); ++g) {
    ASSERT_EQ(reference.groups[g].size(), recomputed.groups[g].size());
    EXPECT_EQ(0, std::memcmp(reference.groups[g].data(), recomputed.groups[g].data(),
                             reference.groups[g].size() * sizeof(float)))
        << "group " << g << " differs under recompute " << policy;
    double norm = 0;
    for (float value : reference.groups[g]) norm += std::fabs(value);
    EXPECT_GT(norm, 0) << "group " << g << " has no gradient";
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, RecomputeTest,
                         ::testing::Combine(::testing::Values(ModelFamily::llama, ModelFamily::gpt2),
                                            ::testing::Values("selective", "full", "1", "3")),
                         [](const auto& info) {
                           return std::string(family_name(std::get<0>(info.param))) + "_" +
                                  (std::isdigit(std::get<1>(info.param)[0]) ? "first" + std::get<1>(info.param)
                                                                             : std::get<1>(info.param));
                         });

// Per-tensor FP8 blocks under `none` keep their linears' inputs as the FP8 copies the weight
// gradients read (cast once, in forward); `selective` recomputes the inputs and casts them in
// backward. Same values, same scales: the same bits.
TEST(Transformer, SavedFp8InputsGiveTheGradientsOfRecastInputs) {
  for (LinearFormat format : {LinearFormat::fp8_delayed, LinearFormat::fp8_current}) {
    for (ModelFamily family : {ModelFamily::llama, ModelFamily::gpt2}) {
      ModelConfig config = test::small_model(family, 3);
      Gradients saved = run_step(config, "none", 8192, format);
      Gradients recast = run_step(config, "selective", 8192, format);
      Gradients high = run_step(config, "none");
      EXPECT_EQ(saved.loss, recast.loss);
      ASSERT_EQ(saved.groups.size(), recast.groups.size());
      bool any_quantization_effect = false;
      for (size_t g = 0; g < saved.groups.size(); ++g) {
        EXPECT_EQ(0, std::memcmp(saved.groups[g].data(), recast.groups[g].data(),
                                 saved.groups[g].size() * sizeof(float)))
            << linear_format_name(format) << " " << family_name(family) << " group " << g;
        any_quantization_effect |= std::memcmp(saved.groups[g].data(), high.groups[g].data(),
                                               saved.groups[g].size() * sizeof(float)) != 0;
      }
      EXPECT_TRUE(any_quantization_effect) << "the FP8 step must differ from the FP32 one";
    }
  }
}

// Current scaling: the norm and activation kernels record the amaxes of the tensors the linears
// cast next, so of the 12 amax passes a block's casts would make (4 inputs, 4 weights, 4 output
// gradients) only 6 remain (the attention output, the weights, the attention's input gradient);
// the step's bits are those of the separate passes.
TEST(Transformer, ProducerAmaxesSpareTheCastsTheirPassesAndChangeNoBits) {
  struct AmaxCounter : TraceObserver {
    int64_t count = 0;
    void on_op(const OpRecord& record) override { count += record.kind == OpKind::amax; }
  };
  for (ModelFamily family : {ModelFamily::llama, ModelFamily::gpt2}) {
    const ModelConfig config = test::small_model(family, 3);
    Gradients result[2];
    int64_t amaxes[2] = {0, 0};
    for (int producer = 0; producer < 2; ++producer) {
      TransformerOptions options;
      options.linear.format = LinearFormat::fp8_current;
      options.linear.producer_amaxes = producer == 1;
      AmaxCounter counter;
      result[producer] = run_step(config, options, &counter);
      amaxes[producer] = counter.count;
    }
    EXPECT_EQ(amaxes[0], 12 * config.layers) << family_name(family);
    // What stays: the attention output (cuDNN writes it), the weights (the optimizer records
    // theirs; this test runs no step), and for GPT-2 dqkv (RoPE's backward records llama's).
    EXPECT_EQ(amaxes[1], (family == ModelFamily::llama ? 5 : 6) * config.layers) << family_name(family);
    EXPECT_EQ(result[0].loss, result[1].loss);
    for (size_t g = 0; g < result[0].groups.size(); ++g)
      EXPECT_EQ(0, std::memcmp(result[0].groups[g].data(), result[1].groups[g].data(),
                               result[0].groups[g].size() * sizeof(float)))
          << family_name(family) << " group " << g;
  }
}

// Delayed FP8 scaling: llama's SwiGLU runs inside the casts of the down projection's input (in
// forward, and in backward where it is recomputed) and the up projection's output gradient, so
// no SwiGLU op runs apart and no BF16 activation or gate/up gradient is written; the step's bits
// are those of the separate ops, under every recompute policy. Current scaling keeps its ops.
TEST(Transformer, FusedProducersDropTheSwigluRopeAndNormPassesAndChangeNoBits) {
  struct SwigluCounter : TraceObserver {
    int64_t forward = 0, backward = 0, rope_backward = 0, casts = 0;
    int64_t norm_outputs = 0;  // allocations of a block norm's output (attn_norm, mlp_norm)
    void on_op(const OpRecord& record) override {
      casts += record.kind == OpKind::quantize;
      forward += record.kind == OpKind::swiglu_forward;
      backward += record.kind == OpKind::swiglu_backward;
      rope_backward += record.kind == OpKind::rope_backward;
    }
    void on_allocation(const AllocationEvent& event) override {
      auto ends_with = [&](const std::string& tail) {
        return event.name.size() >= tail.size() && event.name.compare(event.name.size() - tail.size(), tail.size(), tail) == 0;
      };
      norm_outputs += !event.is_free && (ends_with(".attn_norm") || ends_with(".mlp_norm"));
    }
  };
  for (const char* policy : {"none", "selective", "full"}) {
    for (LinearFormat format : {LinearFormat::fp8_delayed, LinearFormat::fp8_current}) {
      const ModelConfig config = test::small_model(ModelFamily::llama, 3);
      Gradients result[2];
      SwigluCounter counters[2];
      for (int fuse = 0; fuse < 2; ++fuse) {
        TransformerOptions options;
        options.recompute = RecomputePolicy::parse(policy);
        options.linear.format = format;
        options.linear.fuse_producers = fuse == 1;
        result[fuse] = run_step(config, options, &counters[fuse]);
      }
      const std::string label = std::string(policy) + " " + linear_format_name(format);
      const bool fused = format == LinearFormat::fp8_delayed;
      // Unfused: one forward a layer (two where backward recomputes the activation), one backward.
      const int64_t forwards = std::string(policy) == "none" ? 1 : 2;
      EXPECT_EQ(counters[0].forward, forwards * config.layers) << label;
      EXPECT_EQ(counters[0].backward, config.layers) << label;
      // Fused: every one goes into a cast — the forward's into the down projection's input cast,
      // a recompute's into its weight gradient's input cast, the backward's into the up
      // projection's gradient cast.
      EXPECT_EQ(counters[1].forward, fused ? 0 : counters[0].forward) << label;
      EXPECT_EQ(counters[1].backward, fused ? 0 : config.layers) << label;
      // The norms' outputs: two a layer in the forward, again where backward recomputes them,
      // and once more in full recomputation's rerun of the block; fused, the casts compute them
      // and none is allocated.
      const int64_t norm_passes = std::string(policy) == "none" ? 1 : std::string(policy) == "selective" ? 2 : 3;
      EXPECT_EQ(counters[0].norm_outputs, 2 * norm_passes * config.layers) << label;
      EXPECT_EQ(counters[1].norm_outputs, fused ? 0 : counters[0].norm_outputs) << label;
      // RoPE's backward: one a layer unfused; fused, inside the QKV projection's gradient cast.
      EXPECT_EQ(counters[0].rope_backward, config.layers) << label;
      EXPECT_EQ(counters[1].rope_backward, fused ? 0 : config.layers) << label;
      // Where backward recomputes the activation, the up projection's gradient cast also writes
      // the activation's copy for the down projection's weight gradient: one cast a layer less.
      const bool recomputes_act = std::string(policy) != "none";
      EXPECT_EQ(counters[1].casts, counters[0].casts - (fused && recomputes_act ? config.layers : 0)) << label;
      EXPECT_EQ(result[0].loss, result[1].loss) << label;
      // Every cast recorded the same amax, those a fused op makes beside its own output too (the
      // activation's copy that SwiGLU's backward writes for the down projection).
      EXPECT_EQ(result[0].forward_history, result[1].forward_history) << label;
      EXPECT_EQ(result[0].backward_history, result[1].backward_history) << label;
      if (fused) {
        EXPECT_FALSE(result[1].forward_history.empty()) << label;
      }
      for (size_t g = 0; g < result[0].groups.size(); ++g)
        EXPECT_EQ(0, std::memcmp(result[0].groups[g].data(), result[1].groups[g].data(),
                                 result[0].groups[g].size() * sizeof(float)))
            << label << " group " << g;
    }
  }
}

// Gradients exist from their first use in backward to zero_grads (set_to_none): none before
// the step, every group's after it (what the optimizer reads), none again after zero_grads; a
// second step gives the first step's gradients again (they start from zero each time).
TEST(LocalParameterStore, GradientsLiveFromBackwardToTheUpdate) {
  const ModelConfig config = test::small_model(ModelFamily::llama, 3);
  std::unique_ptr<Backend> backend = create_backend("cpu");
  LocalParameterStore store(*backend, config, DType::f32, DType::f32);
  store.initialize(7);
  const size_t gradient = static_cast<size_t>(Lifetime::gradient);
  EXPECT_EQ(backend->memory_stats().live_by_lifetime[gradient], 0u);
  for (const ParamShard& shard : store.shards()) EXPECT_FALSE(shard.grad.defined()) << "group " << shard.group;

  TransformerOptions options;
  Transformer model(config, options, *backend, store);
  const int64_t batch = 2, seq = 16;
  Buffer t, y;
  upload_batch(*backend, config, batch * seq, &t, &y);
  Buffer loss = backend->allocate("loss", Shape{1}, DType::f32, Lifetime::scratch);
  std::vector<std::vector<float>> first;
  for (int step = 0; step < 2; ++step) {
    backend->fill(loss, 0);
    model.forward_backward(t, y, batch, seq, 1.0f / (batch * seq), loss);
    size_t bytes = 0;
    std::vector<std::vector<float>> grads;
    for (const ParamShard& shard : store.shards()) {
      ASSERT_TRUE(shard.grad.defined()) << "group " << shard.group << " after backward";
      bytes += shard.grad.bytes();
      grads.push_back(test::download(*backend, shard.grad));
    }
    EXPECT_GE(backend->memory_stats().live_by_lifetime[gradient], bytes);
    if (step == 0) first = grads;
    else EXPECT_EQ(first, grads) << "the second step's gradients must start from zero too";
    store.zero_grads();
    EXPECT_EQ(backend->memory_stats().live_by_lifetime[gradient], 0u);
    for (const ParamShard& shard : store.shards()) EXPECT_FALSE(shard.grad.defined());
  }
}

// A gradient's first write in a step overwrites (no zero fill runs before it), later ones add;
// what no op wrote is zero once backward is finished, and zero_grads starts the count again.
TEST(LocalParameterStore, FirstWritesOverwriteLaterOnesAddTheRestIsZero) {
  const ModelConfig config = test::small_model(ModelFamily::gpt2, 3);
  std::unique_ptr<Backend> backend = create_backend("cpu");
  LocalParameterStore store(*backend, config, DType::f32, DType::f32);
  store.initialize(7);
  const ModelLayout& layout = store.layout();
  const int g = layout.layer_group(1);
  for (int step = 0; step < 2; ++step) {
    GradTarget first = store.grad_target(g, layout.layer.qkv_weight);
    EXPECT_FALSE(first.accumulate) << "step " << step;
    backend->fill(first.tensor, 3.0f);  // an overwriting op
    EXPECT_TRUE(store.grad_target(g, layout.layer.qkv_weight).accumulate);
    Tensor bias = store.grad(g, layout.layer.qkv_bias);  // an accumulating op's first use: zeros
    for (float value : test::download(*backend, bias)) ASSERT_EQ(value, 0.0f);
    EXPECT_TRUE(store.grad_target(g, layout.layer.qkv_bias).accumulate);
    backend->fill(store.grad(g, layout.layer.out_weight), -1.0f);
    store.finish_backward();
    for (const ParamShard& shard : store.shards()) {
      ASSERT_TRUE(shard.grad.defined());
      const std::vector<float> values = test::download(*backend, shard.grad);
      const ParamGroup& group = layout.groups[static_cast<size_t>(shard.group)];
      for (size_t i = 0; i < group.params.size(); ++i) {
        const ParamSpec& spec = group.params[i];
        const float expected = shard.group == g && static_cast<int>(i) == layout.layer.qkv_weight   ? 3.0f
                               : shard.group == g && static_cast<int>(i) == layout.layer.out_weight ? -1.0f
                                                                                                   : 0.0f;
        for (int64_t e = 0; e < spec.numel(); ++e)
          ASSERT_EQ(values[static_cast<size_t>(spec.offset + e)], expected) << spec.name << " step " << step;
      }
    }
    store.zero_grads();
  }
}

// Two micro-batches without zero_grads between them: the first writes every gradient, the second
// adds to it, so the result is the sum of the two micro-batches' separate gradients.
TEST(Transformer, AMicroBatchAddsToTheGradientsOfTheOneBefore) {
  const ModelConfig config = test::small_model(ModelFamily::gpt2, 3);  // tied embedding: head and table write it
  std::unique_ptr<Backend> backend = create_backend("cpu");
  LocalParameterStore store(*backend, config, DType::f32, DType::f32);
  store.initialize(7);
  Transformer model(config, TransformerOptions{}, *backend, store);
  const int64_t batch = 1, seq = 16;
  Buffer t, y;
  upload_batch(*backend, config, 2 * batch * seq, &t, &y);
  const int64_t rows = batch * seq;
  const Tensor half[2][2] = {{t.tensor().slice_flat(0, Shape{rows}), y.tensor().slice_flat(0, Shape{rows})},
                             {t.tensor().slice_flat(rows, Shape{rows}), y.tensor().slice_flat(rows, Shape{rows})}};
  Buffer loss = backend->allocate("loss", Shape{1}, DType::f32, Lifetime::scratch);
  auto grads = [&] {
    std::vector<std::vector<float>> result;
    for (const ParamShard& shard : store.shards()) result.push_back(test::download(*backend, shard.grad));
    return result;
  };
  std::vector<std::vector<float>> separate[2];
  for (int m = 0; m < 2; ++m) {
    backend->fill(loss, 0);
    model.forward_backward(half[m][0], half[m][1], batch, seq, 1.0f, loss);
    store.finish_backward();
    separate[m] = grads();
    store.zero_grads();
  }
  for (int m = 0; m < 2; ++m) model.forward_backward(half[m][0], half[m][1], batch, seq, 1.0f, loss);
  store.finish_backward();
  const std::vector<std::vector<float>> accumulated = grads();
  ASSERT_EQ(accumulated.size(), separate[0].size());
  for (size_t g = 0; g < accumulated.size(); ++g) {
    std::vector<float> sum(separate[0][g].size());
    for (size_t i = 0; i < sum.size(); ++i) sum[i] = separate[0][g][i] + separate[1][g][i];
    EXPECT_LT(test::relative_l2_error(accumulated[g], sum), 1e-6) << "group " << g;
  }
}

TEST(Transformer, LogitsChunkingKeepsTheLossAndGradients) {
  ModelConfig config = test::small_model(ModelFamily::llama, 3);
  Gradients whole = run_step(config, "none");
  Gradients chunked = run_step(config, "none", 5);  // 32 rows in chunks of 5: a ragged last chunk
  EXPECT_NEAR(whole.loss, chunked.loss, 1e-6 * std::fabs(whole.loss));
  for (size_t g = 0; g < whole.groups.size(); ++g)
    EXPECT_LT(test::relative_l2_error(chunked.groups[g], whole.groups[g]), 1e-5) << "group " << g;
}

// Central differences of the mean loss of one fixed batch: the model's FP32 masters perturbed one
// element at a time (eps 1e-2 keeps the rounding error of the loss difference, about 1e-7 / 1e-2,
// well below the tests' tolerances).
class LossDifferences {
 public:
  LossDifferences(Backend& backend, Transformer& model, const Tensor& tokens, const Tensor& targets, int64_t batch,
                  int64_t seq)
      : backend_(backend), model_(model), tokens_(tokens), targets_(targets), batch_(batch), seq_(seq),
        loss_(backend.allocate("loss", Shape{1}, DType::f32, Lifetime::scratch)) {}
  // One forward and backward, the gradient of the mean loss left in the store.
  void backward() {
    backend_.fill(loss_, 0);
    model_.forward_backward(tokens_, targets_, batch_, seq_, 1.0f / static_cast<float>(rows()), loss_);
  }
  // d(mean loss) / d(master[index]) by central differences; the master is restored.
  double derivative(const Tensor& master, std::vector<float>& weights, size_t index, float eps = 1e-2f) {
    const float original = weights[index];
    weights[index] = original + eps;
    const double plus = mean_loss(master, weights);
    weights[index] = original - eps;
    const double minus = mean_loss(master, weights);
    weights[index] = original;
    backend_.copy_from_host(weights.data(), master);
    return (plus - minus) / (2 * eps);
  }

 private:
  int64_t rows() const { return batch_ * seq_; }
  double mean_loss(const Tensor& master, const std::vector<float>& weights) {
    backend_.copy_from_host(weights.data(), master);
    backend_.fill(loss_, 0);
    model_.forward_loss(tokens_, targets_, batch_, seq_, loss_);
    return static_cast<double>(backend_.read_scalar(loss_)) / static_cast<double>(rows());
  }
  Backend& backend_;
  Transformer& model_;
  Tensor tokens_, targets_;
  int64_t batch_, seq_;
  Buffer loss_;
};

// The analytic gradient of the mean loss against central differences for a few parameters of
// every group, in both families (FP32 forward passes).
TEST(Transformer, GradientMatchesFiniteDifferences) {
  for (ModelFamily family : {ModelFamily::llama, ModelFamily::gpt2}) {
    ModelConfig config = test::small_model(family, 3);
    config.layers = 2;
    std::unique_ptr<Backend> backend = create_backend("cpu");
    LocalParameterStore store(*backend, config, DType::f32, DType::f32);
    store.initialize(11);
    Transformer model(config, TransformerOptions{}, *backend, store);
    const int64_t batch = 2, seq = 8, rows = batch * seq;
    std::vector<int32_t> tokens(rows), targets(rows);
    for (int64_t i = 0; i < rows; ++i) {
      tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 31 + 3) % config.vocab_size);
      targets[static_cast<size_t>(i)] = static_cast<int32_t>((i * 17 + 9) % config.vocab_size);
    }
    Buffer t = test::upload_i32(*backend, tokens, Shape{rows}, "tokens");
    Buffer y = test::upload_i32(*backend, targets, Shape{rows}, "targets");
    LossDifferences differences(*backend, model, t, y, batch, seq);
    differences.backward();
    std::vector<ParamShard> shards = store.shards();
    for (const ParamShard& shard : shards) {
      std::vector<float> grad = test::download(*backend, shard.grad);
      std::vector<float> weights = test::download(*backend, shard.master);
      double max_grad = 0;
      for (float g : grad) max_grad = std::max(max_grad, static_cast<double>(std::fabs(g)));
      // Probe the largest-gradient element and a few spread out ones.
      std::vector<size_t> probes;
      size_t largest = 0;
      for (size_t i = 0; i < grad.size(); ++i)
        if (std::fabs(grad[i]) > std::fabs(grad[largest])) largest = i;
      probes.push_back(largest);
      for (size_t k = 1; k <= 3; ++k) probes.push_back((grad.size() * k) / 4 - 1);
      for (size_t index : probes) {
        EXPECT_NEAR(grad[index], differences.derivative(shard.master, weights, index), 2e-3 * max_grad + 1e-5)
            << family_name(family) << " group " << shard.group << " element " << index;
      }
    }
  }
}

// GPT-2's QKV bias gradient comes from what attention is rather than from column sums over all
// of dqkv (transformer.cpp): the queries' part is a column sum, the keys' part exactly zero, the
// values' part the out projection's bias gradient times Wo. Every element of every layer's QKV
// bias against central differences of the loss (FP32), the keys' part bitwise zero; and two
// micro-batches give the sum of their gradients (the values' part is overwritten from the out
// bias gradient summed so far).
TEST(Transformer, Gpt2QkvBiasGradientMatchesFiniteDifferences) {
  ModelConfig config = test::small_model(ModelFamily::gpt2, 3);
  config.layers = 2;
  std::unique_ptr<Backend> backend = create_backend("cpu");
  LocalParameterStore store(*backend, config, DType::f32, DType::f32);
  store.initialize(5);
  Transformer model(config, TransformerOptions{}, *backend, store);
  const ModelLayout& layout = store.layout();
  const int64_t batch = 2, seq = 8, rows = batch * seq;
  Buffer t, y;
  upload_batch(*backend, config, rows, &t, &y);
  LossDifferences differences(*backend, model, t, y, batch, seq);
  differences.backward();
  store.finish_backward();
  const int64_t q_cols = config.hidden, kv_cols = config.kv_heads * config.head_dim();
  const std::vector<ParamShard> shards = store.shards();
  for (int64_t l = 0; l < config.layers; ++l) {
    const int g = layout.layer_group(l);
    const ParamSpec& spec = layout.groups[static_cast<size_t>(g)].params[static_cast<size_t>(layout.layer.qkv_bias)];
    ASSERT_EQ(spec.numel(), q_cols + 2 * kv_cols);
    ASSERT_LT(static_cast<size_t>(g), shards.size());
    const ParamShard& shard = shards[static_cast<size_t>(g)];
    ASSERT_EQ(shard.group, g);
    const std::vector<float> grad = test::download(*backend, shard.grad);
    std::vector<float> weights = test::download(*backend, shard.master);
    double max_grad = 0;
    for (int64_t e = 0; e < spec.numel(); ++e)
      max_grad = std::max(max_grad, std::fabs(static_cast<double>(grad[static_cast<size_t>(spec.offset + e)])));
    ASSERT_GT(max_grad, 0.0);
    for (int64_t e = 0; e < spec.numel(); ++e) {
      const size_t index = static_cast<size_t>(spec.offset + e);
      if (e >= q_cols && e < q_cols + kv_cols) ASSERT_EQ(grad[index], 0.0f) << "layer " << l << " key bias " << e;
      EXPECT_NEAR(grad[index], differences.derivative(shard.master, weights, index), 2e-3 * max_grad + 1e-6)
          << "layer " << l << " element " << e;
    }
  }
}

}  // namespace
}  // namespace mxtrain
