// Precision recipes at the run level, on the CPU (the oracle emulates every format) and the
// dryrun backend (which counts bytes): the FP16 loss scaler's skip/backoff/growth rule, the
// precision names and start-up lines, quantized_weights (no compute copy of quantized blocks, FP32
// masters kept, less memory than bf16), a few training steps per format, and
// `mxtrain compare-precision` writing its CSV, JSON and SVG.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/dryrun/dryrun_backend.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/distributed/single_communicator.hpp"
#include "mxtrain/numerics/fp8.hpp"
#include "mxtrain/train/loss_scaler.hpp"
#include "mxtrain/train/precision.hpp"
#include "mxtrain/plan/precision_comparison.hpp"
#include "mxtrain/train/session.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

TEST(LossScaler, BacksOffAndSkipsOnOverflowAndGrowsAfterTheInterval) {
  LossScalerOptions options;
  options.initial_scale = 1024;
  options.growth_interval = 3;
  LossScaler scaler(options);
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_TRUE(scaler.update(false, 1));
  EXPECT_TRUE(scaler.update(false, 2));
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_TRUE(scaler.update(false, 3));  // third clean step: x2
  EXPECT_EQ(scaler.scale(), 2048.0f);
  EXPECT_TRUE(scaler.update(false, 4));
  EXPECT_FALSE(scaler.update(true, 5));  // overflow: skip, x0.5, the clean count restarts
  EXPECT_EQ(scaler.scale(), 1024.0f);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_EQ(scaler.clean_steps(), 0);
  EXPECT_TRUE(scaler.update(false, 6));
  EXPECT_TRUE(scaler.update(false, 7));
  EXPECT_EQ(scaler.scale(), 1024.0f);  // only two clean steps since the backoff
  EXPECT_TRUE(scaler.update(false, 8));
  EXPECT_EQ(scaler.scale(), 2048.0f);
}

// A resumed fp16 run continues with the saved scale and clean-step count (checkpoints keep them).
TEST(LossScaler, ARestoredScalerContinuesAsTheSavedOne) {
  LossScalerOptions options;
  options.initial_scale = 1024;
  options.growth_interval = 3;
  LossScaler saved(options), restored(options);
  EXPECT_FALSE(saved.update(true, 1));  // 512
  EXPECT_TRUE(saved.update(false, 2));
  EXPECT_TRUE(saved.update(false, 3));
  restored.restore(saved.scale_value(), saved.clean_steps());
  EXPECT_EQ(restored.scale(), 512.0f);
  EXPECT_TRUE(saved.update(false, 4));
  EXPECT_TRUE(restored.update(false, 4));  // the third clean step for both: x2
  EXPECT_EQ(restored.scale(), saved.scale());
  EXPECT_EQ(restored.scale(), 1024.0f);
  // A shorter growth interval than the saved run's grows at the next clean step.
  options.growth_interval = 2;
  LossScaler shorter(options);
  shorter.restore(4096, 5);
  EXPECT_TRUE(shorter.update(false, 6));
  EXPECT_EQ(shorter.scale(), 8192.0f);
  // A scale no run reaches is a damaged checkpoint.
  EXPECT_THROW(restored.restore(0.0, 0), Error);
  EXPECT_THROW(restored.restore(std::nan(""), 0), Error);
}

TEST(LossScaler, DefaultsArePytorchsAndDivergenceEndsTheRun) {
  const LossScalerOptions defaults = loss_scaler_options(PrecisionConfig{});
  EXPECT_EQ(defaults.initial_scale, 65536.0);
  EXPECT_EQ(defaults.growth_interval, 2000);
  EXPECT_EQ(defaults.backoff_factor, 0.5);
  EXPECT_EQ(defaults.growth_factor, 2.0);
  LossScaler scaler(defaults);
  int step = 0;
  try {
    while (step < 100) scaler.update(true, ++step);
    FAIL() << "the scaler never gave up";
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::numerics);
    EXPECT_NE(error.full_message().find("fix:"), std::string::npos);
  }
  EXPECT_EQ(step, 41);  // 2^16 halved 41 times falls below 2^-24
}

RunConfig tiny(const std::string& precision) {
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = {{"model.hidden", "64"},      {"model.heads", "2"},      {"model.kv_heads", "1"},
                       {"model.layers", "2"},       {"model.ffn_hidden", "128"}, {"train.seq_len", "32"},
                       {"train.micro_batch_size", "4"}, {"train.device", "cpu"}, {"train.precision", precision},
                       {"schedule.warmup_steps", "2"}};
  return load_config(sources);
}

TEST(Precision, NamesStartupLinesAndErrors) {
  CpuBackend cpu(1);
  RunConfig config = tiny("fp8");
  config.precision.amax_history_len = 32;
  const PrecisionPlan fp8 = resolve_precision(config, cpu);
  EXPECT_EQ(fp8.linear, LinearFormat::fp8_delayed);
  EXPECT_EQ(fp8.activation, DType::f32);
  EXPECT_EQ(fp8.startup_line.rfind("Using FP8 recipe: DelayedScaling(format=HYBRID, amax_history_len=32, "
                                   "amax_compute_algo=max, margin=0)",
                                   0),
            0u)
      << fp8.startup_line;
  config.train.precision = "fp8-current";
  EXPECT_NE(resolve_precision(config, cpu).startup_line.find("Float8CurrentScaling(format=HYBRID)"), std::string::npos);
  config.train.precision = "mxfp8";
  const std::string mx = resolve_precision(config, cpu).startup_line;
  EXPECT_EQ(mx.rfind("MXFP8 enabled (block 32, E8M0 scales, RCEIL rounding", 0), 0u) << mx;
  config.train.precision = "nvfp4";
  config.model.layers = 22;
  const std::string nv = resolve_precision(config, cpu).startup_line;
  EXPECT_NE(nv.find("18 of 22 blocks quantized (first 0 and last 4 in FP32)"), std::string::npos) << nv;
  // auto keeps min(4, layers / 4) blocks of an NVFP4 model in high precision, nothing for the others.
  EXPECT_EQ(linear_recipe_options(config, resolve_precision(config, cpu)).bf16_last_layers, 4);
  config.model.layers = 8;
  EXPECT_EQ(linear_recipe_options(config, resolve_precision(config, cpu)).bf16_last_layers, 2);
  config.train.precision = "fp8";
  EXPECT_EQ(linear_recipe_options(config, resolve_precision(config, cpu)).bf16_last_layers, 0);
  config.precision.bf16_last_layers = "3";
  EXPECT_EQ(linear_recipe_options(config, resolve_precision(config, cpu)).bf16_last_layers, 3);

  EXPECT_EQ(resolve_precision("fp16", "cuda", false).activation, DType::f16);
  EXPECT_TRUE(resolve_precision("fp16", "cuda", false).loss_scaling);
  EXPECT_EQ(resolve_precision("fp8", "cuda", false).activation, DType::bf16);
  EXPECT_THROW(resolve_precision("fp16", "cpu", false), Error);  // the cpu computes in FP32
  EXPECT_THROW(resolve_precision("fp7", "cuda", false), Error);
  std::set<std::string> names(precision_names().begin(), precision_names().end());
  for (const char* name : {"fp32", "bf16", "fp16", "fp8", "fp8-current", "mxfp8", "nvfp4"}) EXPECT_TRUE(names.count(name));
}

TEST(Precision, ConfigKeysValidate) {
  RunConfig config = tiny("bf16");
  std::vector<Field> list = fields(config);
  auto set = [&](const std::string& key, const std::string& value) {
    for (Field& field : list)
      if (field.key == key) return field.set(value);
    FAIL() << "no key " << key;
  };
  set("precision.bf16_last_layers", "2");
  EXPECT_EQ(config.precision.bf16_last_layers, "2");
  EXPECT_THROW(set("precision.bf16_last_layers", "-1"), Error);
  EXPECT_THROW(set("precision.bf16_first_layers", "two"), Error);
  EXPECT_THROW(set("precision.mx_scale_rounding", "nearest"), Error);
  EXPECT_THROW(set("precision.margin", "101"), Error);
  EXPECT_THROW(set("precision.grad_dtype", "fp16"), Error);
  set("precision.grad_dtype", "bf16");
  EXPECT_EQ(config.precision.grad_dtype, "bf16");
  set("precision.quantized_weights", "True");  // SageMaker's spelling
  EXPECT_EQ(config.precision.quantized_weights, "true");
  EXPECT_THROW(set("precision.quantized_weights", "yes"), Error);
  set("precision.quantized_weights", "auto");
  EXPECT_NO_THROW(validate(config));  // auto with bf16: nothing to quantize, nothing asked
  set("precision.quantized_weights", "true");
  EXPECT_THROW(validate(config), Error);  // bf16 has nothing to quantize
  config.train.precision = "fp8";
  EXPECT_NO_THROW(validate(config));
}

// Current scaling: the optimizer step records the amax of each quantized weight it writes
// (AdamWArgs::weight_amaxes), so the next step's casts skip their passes over the weights. The
// record is the amax op's value over the weight as the next cast reads it (so the casts, and the
// run, do not change), and only the attention output (and, without RoPE, dqkv) keep a pass.
TEST(Precision, TheOptimizerRecordsTheQuantizedWeightsAmaxesForCurrentScaling) {
  struct AmaxCounter final : TraceObserver {
    int64_t count = 0;
    void on_op(const OpRecord& record) override { count += record.kind == OpKind::amax; }
    void on_allocation(const AllocationEvent&) override {}
  };
  for (ModelFamily family_kind : {ModelFamily::llama, ModelFamily::gpt2}) {
    const std::string family = family_name(family_kind);
    RunConfig config = tiny("fp8-current");
    config.model.family = family_kind;
    if (family_kind == ModelFamily::gpt2) config.model.kv_heads = config.model.heads;
    CpuBackend backend(1);
    const PrecisionPlan plan = resolve_precision(config, backend);
    TrainingSession session(config, backend, plan, make_parameter_store(backend, config, plan, nullptr, 1));
    const int64_t batch = config.train.micro_batch_size, seq = config.train.seq_len;
    std::vector<int32_t> tokens(static_cast<size_t>(batch * seq)), targets(tokens.size());
    for (size_t i = 0; i < tokens.size(); ++i) {
      tokens[i] = static_cast<int32_t>((i * 7 + 3) % 97);
      targets[i] = static_cast<int32_t>((i * 5 + 1) % 97);
    }
    const std::vector<TokenBatch> batches(1, TokenBatch{tokens.data(), targets.data(), batch, seq});
    // Each weight's largest value sits at one end of it, so a record over a shifted slice differs.
    const ModelLayout& layout = session.params().layout();
    const int weights[] = {layout.layer.qkv_weight, layout.layer.out_weight, layout.layer.up_weight,
                           layout.layer.down_weight};
    for (int64_t layer = 0; layer < config.model.layers; ++layer)
      for (int kind = 0; kind < kLinearKinds; ++kind) {
        const Tensor weight = session.params().weight(layout.layer_group(layer), weights[kind]);
        std::vector<float> values = test::download(backend, weight);
        values[kind % 2 == 0 ? 0 : values.size() - 1] = 4.0f * static_cast<float>(kind + 2);
        backend.copy_from_host(values.data(), weight);
      }
    AmaxCounter counter;
    backend.set_observer(&counter);
    std::vector<int64_t> passes;
    for (int64_t step = 1; step <= 3; ++step) {
      counter.count = 0;
      session.step(batches, batch * seq, 1e-3, step);
      passes.push_back(counter.count);
      // Each weight's record equals the amax op over the weight the next forward casts.
      const std::vector<float> records = test::download(backend, session.model().linears().current_amax());
      for (int64_t layer = 0; layer < config.model.layers; ++layer) {
        for (int kind = 0; kind < kLinearKinds; ++kind) {
          const Tensor weight = session.params().weight(layout.layer_group(layer), weights[kind]);
          Buffer amax = backend.allocate("amax", Shape{1}, DType::f32, Lifetime::scratch);
          backend.amax(weight, amax, false);
          const size_t slot = static_cast<size_t>(3 * (layer * kLinearKinds + kind) + 1);
          EXPECT_EQ(numerics::float_to_bits(records[slot]), numerics::float_to_bits(test::download(backend, amax)[0]))
              << family << " step " << step << " layer " << layer << " " << linear_kind_name(static_cast<LinearKind>(kind));
        }
      }
    }
    backend.set_observer(nullptr);
    // Step 1 casts the initial weights with passes of their own (4 a block); later steps take the
    // optimizer's records. The test's own amax ops above come after each count.
    const int64_t kept = family_kind == ModelFamily::llama ? 1 : 2;  // attention output (+ dqkv)
    EXPECT_EQ(passes[0], (kept + 4) * config.model.layers) << family;
    EXPECT_EQ(passes[1], kept * config.model.layers) << family;
    EXPECT_EQ(passes[2], kept * config.model.layers) << family;
  }
}

// Delayed scaling: the optimizer step writes each quantized weight's next rowwise FP8 copy as it
// updates the weight (AdamWArgs::weight_casts), and the next forward takes it instead of casting
// the weight: from the second step on, 4 casts a block fewer a step, and the run's losses,
// evaluation, weights, scales and amax histories are those of the forward's own casts bit for
// bit (the newest history slot holds the weights' records a step earlier: the optimizer makes
// them); from the second step on the copies come back to the addresses the forward took them
// from. With the FP32 master or the BF16 copy as the weight the casts read, one or two
// micro-batches (the second casts again), on Llama and GPT-2 (its GELU casts in the forward).
TEST(Precision, DelayedScalingTakesTheOptimizersWeightCopiesWithTheSameBits) {
  struct CastCounter final : TraceObserver {
    int64_t count = 0;
    void on_op(const OpRecord& record) override { count += record.kind == OpKind::quantize; }
    void on_allocation(const AllocationEvent&) override {}
  };
  struct Run {
    std::vector<double> losses;
    std::vector<int64_t> casts;
    std::vector<std::vector<float>> masters, state;
    std::vector<float> newest_slot;
  };
  for (ModelFamily family_kind : {ModelFamily::llama, ModelFamily::gpt2}) {
    for (const char* quantized_weights : {"true", "false"}) {
      for (int micro_batches : {1, 2}) {
        const std::string what = std::string(family_name(family_kind)) + ", quantized_weights " + quantized_weights +
                                 ", " + std::to_string(micro_batches) + " micro-batches";
        Run runs[2];
        for (int on = 0; on < 2; ++on) {
          RunConfig config = tiny("fp8");
          config.model.family = family_kind;
          if (family_kind == ModelFamily::gpt2) config.model.kv_heads = config.model.heads;
          config.precision.quantized_weights = quantized_weights;
          config.precision.fp8_optimizer_weight_casts = on == 1;
          config.precision.amax_history_len = 4;
          CpuBackend backend(1);
          const PrecisionPlan plan = resolve_precision(config, backend);
          TrainingSession session(config, backend, plan, make_parameter_store(backend, config, plan, nullptr, 1));
          const int64_t batch = config.train.micro_batch_size, seq = config.train.seq_len;
          std::vector<std::vector<int32_t>> data;
          for (int i = 0; i < 2 * micro_batches; ++i) {
            data.emplace_back(static_cast<size_t>(batch * seq));
            for (size_t j = 0; j < data.back().size(); ++j)
              data.back()[j] = static_cast<int32_t>((j * (7 + 2 * i) + 3 * i + 1) % 97);
          }
          std::vector<TokenBatch> batches;
          for (int i = 0; i < micro_batches; ++i)
            batches.push_back(TokenBatch{data[2 * i].data(), data[2 * i + 1].data(), batch, seq});
          CastCounter counter;
          backend.set_observer(&counter);
          Run& run = runs[on];
          for (int64_t step = 1; step <= 4; ++step) {
            counter.count = 0;
            const StepResult result = session.step(batches, micro_batches * batch * seq, 1e-2, step);
            run.casts.push_back(counter.count);
            // From the second step on the optimizer puts each copy where the forward took the
            // last one (what lets a step graph replay; the CPU's allocator is the GPU's).
            if (on == 1 && step >= 2)
              EXPECT_TRUE(session.model().linears().weight_casts_repeat()) << what << ", step " << step;
            run.losses.push_back(result.loss);
            run.losses.push_back(result.grad_norm);
            if (step == 2) run.losses.push_back(session.evaluate(batches));
          }
          backend.set_observer(nullptr);
          for (const ParamShard& shard : session.params().shards()) {
            std::vector<float> master(static_cast<size_t>(shard.count));
            download_master(backend, shard, master.data());
            run.masters.push_back(std::move(master));
          }
          const LinearRecipe& linears = session.model().linears();
          std::vector<float> forward = test::download(backend, linears.forward_history());
          const size_t slot = static_cast<size_t>(linears.forward_history().cols());
          run.newest_slot.assign(forward.begin(), forward.begin() + static_cast<std::ptrdiff_t>(slot));
          forward.erase(forward.begin(), forward.begin() + static_cast<std::ptrdiff_t>(slot));
          run.state = {forward, test::download(backend, linears.backward_history()),
                       test::download(backend, linears.forward_scale()), test::download(backend, linears.backward_scale())};
        }
        ASSERT_EQ(runs[0].losses.size(), runs[1].losses.size());
        for (size_t i = 0; i < runs[0].losses.size(); ++i)
          EXPECT_EQ(runs[0].losses[i], runs[1].losses[i]) << what << ", loss " << i;
        for (size_t i = 0; i < runs[0].masters.size(); ++i)
          EXPECT_EQ(0, std::memcmp(runs[0].masters[i].data(), runs[1].masters[i].data(),
                                   runs[0].masters[i].size() * sizeof(float)))
              << what << ", group " << i;
        for (size_t i = 0; i < runs[0].state.size(); ++i) EXPECT_EQ(runs[0].state[i], runs[1].state[i]) << what << " " << i;
        // The newest slot: the inputs' entries (even) are zero in both, the weights' (odd) hold the
        // optimizer's records of the next weights where it casts them.
        const int64_t layers = 2;
        for (size_t i = 0; i < runs[0].newest_slot.size(); ++i) {
          EXPECT_EQ(runs[0].newest_slot[i], 0.0f) << what << " entry " << i;
          if (i % 2 == 0) EXPECT_EQ(runs[1].newest_slot[i], 0.0f) << what << " entry " << i;
          else EXPECT_GT(runs[1].newest_slot[i], 0.0f) << what << " entry " << i;
        }
        // The first step casts every weight in its forwards; later ones take the copies (the second
        // micro-batch's forward casts again).
        EXPECT_EQ(runs[1].casts[0], runs[0].casts[0]) << what;
        for (size_t step = 1; step < runs[0].casts.size(); ++step)
          EXPECT_EQ(runs[1].casts[step], runs[0].casts[step] - 4 * layers) << what << ", step " << step + 1;
      }
    }
  }
}

// Without clipping the step's norm comes out of the AdamW pass (AdamWArgs::grad_norm_output):
// no sum_of_squares op runs, and the losses and reported norms are those of a run whose clip
// never binds (max norm 1e9, which takes the separate pass) bit for bit on the CPU.
TEST(Precision, WithoutClippingTheOptimizerPassReportsTheNorm) {
  struct NormCounter final : TraceObserver {
    int64_t passes = 0;
    void on_op(const OpRecord& record) override { passes += record.kind == OpKind::sum_of_squares; }
    void on_allocation(const AllocationEvent&) override {}
  };
  std::vector<std::vector<StepResult>> runs;
  for (double clip : {0.0, 1e9}) {
    RunConfig config = tiny("fp32");
    config.optimizer.grad_clip = clip;
    CpuBackend backend(2);
    const PrecisionPlan plan = resolve_precision(config, backend);
    TrainingSession session(config, backend, plan, make_parameter_store(backend, config, plan, nullptr, 1));
    const int64_t batch = config.train.micro_batch_size, seq = config.train.seq_len;
    std::vector<int32_t> tokens(static_cast<size_t>(batch * seq)), targets(tokens.size());
    NormCounter counter;
    backend.set_observer(&counter);
    runs.emplace_back();
    for (int64_t step = 1; step <= 3; ++step) {
      for (size_t i = 0; i < tokens.size(); ++i) {
        tokens[i] = static_cast<int32_t>((i * 7 + 3 * step) % 97);
        targets[i] = static_cast<int32_t>((i * 5 + step) % 97);
      }
      // Two micro-batches: the norm covers the accumulated gradients.
      const std::vector<TokenBatch> batches(2, TokenBatch{tokens.data(), targets.data(), batch, seq});
      runs.back().push_back(session.step(batches, 2 * batch * seq, 1e-3, step));
    }
    backend.set_observer(nullptr);
    EXPECT_EQ(counter.passes > 0, clip > 0) << "clip " << clip;
  }
  for (size_t step = 0; step < runs[0].size(); ++step) {
    EXPECT_EQ(runs[0][step].loss, runs[1][step].loss) << "step " << step + 1;
    EXPECT_EQ(runs[0][step].grad_norm, runs[1][step].grad_norm) << "step " << step + 1;
    EXPECT_GT(runs[0][step].grad_norm, 0.0) << "step " << step + 1;
  }
}

// Collects the names of allocations.
class AllocationLog final : public TraceObserver {
 public:
  void on_op(const OpRecord&) override {}
  void on_allocation(const AllocationEvent& event) override {
    if (!event.is_free) names.insert(event.name);
  }
  std::set<std::string> names;
};

// The peak bytes of one dryrun step (bf16 activations, as on a GPU).
// cuda_allocations: with the cuda backend's own scratch (CudaAllocationModel) as well.
size_t dryrun_peak(const RunConfig& config, TraceObserver* log = nullptr, bool cuda_allocations = false) {
  CudaAllocationModel cuda_model;
  cuda_model.enabled = cuda_allocations;
  DryrunBackend backend(0, "h200", cuda_model);
  backend.set_native_quantized_gemms({DType::e4m3});  // Hopper: real FP8 GEMMs
  if (log) backend.set_observer(log);
  const PrecisionPlan plan = resolve_precision(config.train.precision, "cuda", false);
  TrainingSession session(config, backend, plan, make_parameter_store(backend, config, plan, nullptr, 1));
  const std::vector<TokenBatch> batch(1, TokenBatch{nullptr, nullptr, config.train.micro_batch_size, config.train.seq_len});
  session.step(batch, config.train.micro_batch_size * config.train.seq_len, 1e-3, 1);
  backend.set_observer(nullptr);
  return backend.memory_stats().peak_live_bytes;
}

// The dryrun prices the AdamW pass's norm partials as the cuda backend allocates them (one f32
// a block of 256 eight-element vectors, per group) when the norm comes out of it, none otherwise.
TEST(Precision, TheDryrunAllocatesTheOptimizerNormPartials) {
  struct Partials final : TraceObserver {
    std::vector<size_t> bytes;
    void on_op(const OpRecord&) override {}
    void on_allocation(const AllocationEvent& event) override {
      if (!event.is_free && event.name == "adamw.norm_partials") bytes.push_back(event.bytes_requested);
    }
  };
  for (double clip : {0.0, 1.0}) {
    RunConfig config = tiny("bf16");
    config.train.device = "cuda";
    config.optimizer.grad_clip = clip;
    Partials partials;
    dryrun_peak(config, &partials, true);
    const ModelLayout layout = build_layout(config.model);
    if (clip > 0) {
      EXPECT_TRUE(partials.bytes.empty());
      continue;
    }
    ASSERT_EQ(partials.bytes.size(), layout.groups.size());
    for (size_t g = 0; g < layout.groups.size(); ++g) {
      const int64_t n = layout.groups[g].numel, vectors = n % 8 == 0 ? n / 8 : n;
      EXPECT_EQ(partials.bytes[g], 4 * static_cast<size_t>((vectors + 255) / 256)) << layout.groups[g].name;
    }
  }
}

// precision.grad_dtype: auto gives the blocks BF16 gradients only in a bf16, fp8 or fp8-current
// run on the GPU of one process with one micro-batch a step; bf16 asked for elsewhere is a config
// error; f32 always holds.
TEST(Precision, BlockGradientDtypeFollowsTheRun) {
  RunConfig config = tiny("bf16");
  const PrecisionPlan bf16 = resolve_precision("bf16", "cuda", false);
  const PrecisionPlan fp32 = resolve_precision("fp32", "cuda", false);
  const PrecisionPlan fp8 = resolve_precision("fp8", "cuda", false);
  const PrecisionPlan fp8_current = resolve_precision("fp8-current", "cuda", false);
  const PrecisionPlan mxfp8 = resolve_precision("mxfp8", "cuda", false);
  const PrecisionPlan fp8_cpu = resolve_precision("fp8", "cpu", false);  // computes in f32
  EXPECT_EQ(block_grad_dtype(config, bf16, 1), DType::bf16);
  EXPECT_EQ(block_grad_dtype(config, fp32, 1), DType::f32);
  EXPECT_EQ(block_grad_dtype(config, fp8, 1), DType::bf16);
  EXPECT_EQ(block_grad_dtype(config, fp8_current, 1), DType::bf16);
  EXPECT_EQ(block_grad_dtype(config, mxfp8, 1), DType::f32);  // emulated on Hopper: kept f32
  EXPECT_EQ(block_grad_dtype(config, fp8_cpu, 1), DType::f32);
  EXPECT_EQ(block_grad_dtype(config, bf16, 2), DType::f32);  // FSDP reduces f32
  EXPECT_EQ(block_grad_dtype(config, fp8, 2), DType::f32);
  config.train.global_batch_size = 3 * config.train.micro_batch_size;
  EXPECT_EQ(block_grad_dtype(config, bf16, 1), DType::f32);  // accumulation over micro-batches
  EXPECT_EQ(block_grad_dtype(config, fp8, 1), DType::f32);
  EXPECT_EQ(block_grad_dtype(config, bf16, 3), DType::f32);
  config.precision.grad_dtype = "bf16";
  EXPECT_THROW(block_grad_dtype(config, bf16, 1), Error);
  config.train.global_batch_size = 0;
  EXPECT_EQ(block_grad_dtype(config, bf16, 1), DType::bf16);
  EXPECT_EQ(block_grad_dtype(config, fp8_current, 1), DType::bf16);
  EXPECT_THROW(block_grad_dtype(config, bf16, 2), Error);
  EXPECT_THROW(block_grad_dtype(config, mxfp8, 1), Error);
  EXPECT_THROW(block_grad_dtype(config, fp8_cpu, 1), Error);
  config.precision.grad_dtype = "f32";
  EXPECT_EQ(block_grad_dtype(config, bf16, 1), DType::f32);
  EXPECT_EQ(block_grad_dtype(config, fp8, 1), DType::f32);
}

// BF16 block gradients hold one micro-batch's sum: a step fed several micro-batches (a config
// that says one) is refused with the fix before any gradient is written; f32 ones accumulate.
TEST(Precision, Bf16BlockGradientsRefuseAStepOfSeveralMicroBatches) {
  for (const char* grad_dtype : {"auto", "f32"}) {
    RunConfig config = tiny("bf16");
    config.train.device = "cuda";
    config.precision.grad_dtype = grad_dtype;
    DryrunBackend backend(0, "h200");
    const PrecisionPlan plan = resolve_precision(config.train.precision, "cuda", false);
    TrainingSession session(config, backend, plan, make_parameter_store(backend, config, plan, nullptr, 1));
    const std::vector<TokenBatch> batches(2, TokenBatch{nullptr, nullptr, config.train.micro_batch_size,
                                                        config.train.seq_len});
    const int64_t tokens = 2 * config.train.micro_batch_size * config.train.seq_len;
    if (std::string(grad_dtype) == "auto") {
      EXPECT_THROW(session.step(batches, tokens, 1e-3, 1), Error);
      EXPECT_NO_THROW(session.step({batches[0]}, tokens / 2, 1e-3, 1));
    } else {
      EXPECT_NO_THROW(session.step(batches, tokens, 1e-3, 1));
    }
  }
}

// A bf16 run's block gradients take half the bytes of f32 ones (the dryrun's allocations), the
// embedding's and head's keep f32, and the step's peak falls.
TEST(Precision, Bf16BlockGradientsHalveTheirBytes) {
  struct GradBytes final : TraceObserver {
    std::map<std::string, size_t> bytes;
    void on_op(const OpRecord&) override {}
    void on_allocation(const AllocationEvent& event) override {
      if (!event.is_free && event.lifetime == Lifetime::gradient) bytes[event.name] = event.bytes_requested;
    }
  };
  RunConfig config = tiny("bf16");
  config.train.device = "cuda";
  std::map<std::string, size_t> bytes[2];
  size_t peaks[2];
  for (int i = 0; i < 2; ++i) {
    config.precision.grad_dtype = i == 0 ? "auto" : "f32";
    GradBytes grads;
    peaks[i] = dryrun_peak(config, &grads);
    bytes[i] = grads.bytes;
  }
  const ModelLayout layout = build_layout(config.model);
  ASSERT_EQ(bytes[0].size(), layout.groups.size());
  for (size_t g = 0; g < layout.groups.size(); ++g) {
    const std::string name = layout.groups[g].name + ".grad";
    const bool block = layout.is_layer_group(static_cast<int>(g));
    EXPECT_EQ(bytes[1][name], 4 * static_cast<size_t>(layout.groups[g].numel)) << name;
    EXPECT_EQ(bytes[0][name], (block ? 2 : 4) * static_cast<size_t>(layout.groups[g].numel)) << name;
  }
  EXPECT_LT(peaks[0], peaks[1]);
}

TEST(Precision, QuantizedWeightsDropTheBf16CopyAndLowerPeakMemory) {
  ConfigSources sources;
  sources.read_environment = false;
  // Weights dominate (a short micro-batch), as in quantized_weights' intended use.
  sources.overrides = {{"model.preset", "tiny"}, {"train.seq_len", "64"}, {"train.micro_batch_size", "1"},
                       {"train.precision", "fp8"}};
  RunConfig fp8 = load_config(sources);
  RunConfig bf16 = fp8;
  bf16.train.precision = "bf16";
  bf16.precision.grad_dtype = "f32";  // fp8's gradients: the runs differ in their weight copies only
  fp8.precision.quantized_weights = "false";
  RunConfig quantized = fp8;
  quantized.precision.quantized_weights = "true";
  quantized.precision.bf16_last_layers = "1";
  AllocationLog plain, dropped;
  const size_t bf16_peak = dryrun_peak(bf16);
  dryrun_peak(fp8, &plain);
  const size_t quantized_peak = dryrun_peak(quantized, &dropped);
  for (int layer = 0; layer < 4; ++layer) {
    const std::string copy = "layers." + std::to_string(layer) + ".weight";
    EXPECT_TRUE(plain.names.count(copy)) << copy;
    // The last block stays in bf16 and keeps its copy; the quantized ones have only masters.
    EXPECT_EQ(dropped.names.count(copy), layer == 3 ? 1u : 0u) << copy;
    EXPECT_TRUE(dropped.names.count("layers." + std::to_string(layer) + ".master")) << layer;
  }
  // tiny's token table is untied: the lookup rounds its FP32 master's rows, so no copy either.
  EXPECT_FALSE(dropped.names.count("embed.weight"));
  EXPECT_TRUE(plain.names.count("embed.weight"));
  const size_t layer_copy_bytes = 3 * 2 * static_cast<size_t>(build_layout(fp8.model).groups[1].numel);
  EXPECT_LT(quantized_peak + layer_copy_bytes / 2, bf16_peak)
      << "peak " << quantized_peak << " with quantized weights, " << bf16_peak << " in bf16";

  // The model reads the FP32 masters of quantized blocks, the bf16 copy of the others.
  DryrunBackend backend(0, "h200");
  const PrecisionPlan plan = resolve_precision("fp8", "cuda", false);
  auto store = make_parameter_store(backend, quantized, plan, nullptr, 1);
  const ModelLayout& layout = store->layout();
  EXPECT_EQ(store->weight(layout.layer_group(0), layout.layer.qkv_weight).dtype, DType::f32);
  EXPECT_EQ(store->weight(layout.layer_group(3), layout.layer.qkv_weight).dtype, DType::bf16);
  EXPECT_EQ(store->weight(layout.embed_group, layout.token_table).dtype, DType::f32);
  EXPECT_EQ(store->weight(layout.head_group, layout.head_weight).dtype, DType::bf16);  // a BF16 GEMM operand

  // A tied token table is the head's BF16 operand: it keeps its copy.
  RunConfig tied = quantized;
  tied.model.tied_embeddings = true;
  auto tied_store = make_parameter_store(backend, tied, plan, nullptr, 1);
  EXPECT_EQ(tied_store->weight(tied_store->layout().embed_group, tied_store->layout().token_table).dtype, DType::bf16);

  // auto: on for the quantized recipes on one process; off under FSDP, and for bf16.
  RunConfig automatic = quantized;
  automatic.precision.quantized_weights = "auto";
  EXPECT_TRUE(uses_quantized_weights(automatic, plan, false));
  EXPECT_FALSE(uses_quantized_weights(automatic, plan, true));
  EXPECT_TRUE(uses_quantized_weights(quantized, plan, false));
  EXPECT_FALSE(uses_quantized_weights(fp8, plan, false));
  EXPECT_FALSE(uses_quantized_weights(automatic, resolve_precision("bf16", "cuda", false), false));
  EXPECT_EQ(dryrun_peak(automatic), quantized_peak);

  // Under FSDP auto keeps the copies; true is an error that names the fix.
  SingleProcessCommunicator world(backend);
  EXPECT_THROW(make_parameter_store(backend, quantized, plan, &world, 1), Error);
  auto sharded = make_parameter_store(backend, automatic, plan, &world, 1);
  EXPECT_NE(sharded->strategy_name(), "local");
}

// A few steps per format on the test corpus: every recipe trains, and the quantized ones really
// quantize (their losses differ from FP32's, but stay close).
class PrecisionTraining : public ::testing::Test {
 protected:
  void SetUp() override { corpus_ = test::make_test_corpus(dir_.file("corpus")); }
  RunConfig config(const std::string& precision, int64_t steps) {
    RunConfig c = tiny(precision);
    c.data.train = corpus_ + "/train_*.bin";
    c.data.val = "";
    c.train.steps = steps;
    c.checkpoint.dir = dir_.file("out");
    return c;
  }
  test::TempDir dir_;
  std::string corpus_;
};

TEST_F(PrecisionTraining, CompareRunsEveryFormatOnTheSameBatches) {
  PrecisionComparisonOptions options;
  options.formats = parse_precision_list("fp32,fp8,fp8-current,mxfp8,nvfp4");
  options.output_dir = dir_.file("compare");
  options.log_every = 100;
  RunConfig run = config("fp32", 6);
  run.data.val = corpus_ + "/val_*.bin";
  run.eval.batches = 2;
  const PrecisionComparison comparison = compare_precisions(run, options);
  ASSERT_EQ(comparison.curves.size(), 5u);
  EXPECT_EQ(comparison.baseline, "fp32");
  const FormatCurve& baseline = comparison.curves[0];
  EXPECT_EQ(baseline.gap, 0.0);
  for (const FormatCurve& curve : comparison.curves) {
    ASSERT_EQ(curve.losses.size(), 6u) << curve.format;
    // Same initial weights and first batch: step 1's loss is the same up to quantization.
    EXPECT_NEAR(curve.losses[0], baseline.losses[0], 0.05) << curve.format;
    EXPECT_LT(curve.losses[5], curve.losses[0]) << curve.format << " did not learn";
    EXPECT_LT(std::fabs(curve.gap), 0.05) << curve.format;
    if (curve.format != "fp32") EXPECT_NE(curve.losses[5], baseline.losses[5]) << curve.format << " did not quantize";
    // The held-out loss after the last step, on the same validation windows for every format.
    EXPECT_GT(curve.val_loss, 0.0) << curve.format;
    EXPECT_LT(curve.val_loss, curve.losses[0]) << curve.format;
    EXPECT_NEAR(curve.val_gap, (curve.val_loss - baseline.val_loss) / baseline.val_loss, 1e-12) << curve.format;
    if (curve.format != "fp32") EXPECT_NE(curve.val_loss, baseline.val_loss) << curve.format;
  }
  EXPECT_EQ(baseline.val_gap, 0.0);
  std::ifstream csv(comparison.csv_path);
  std::string header;
  std::getline(csv, header);
  EXPECT_EQ(header, "step,fp32,fp8,fp8-current,mxfp8,nvfp4");
  const nlohmann::json json = nlohmann::json::parse(std::ifstream(comparison.json_path));
  EXPECT_EQ(json["baseline"], "fp32");
  EXPECT_EQ(json["formats"].size(), 5u);
  EXPECT_EQ(json["formats"][1]["val_loss"].get<double>(), comparison.curves[1].val_loss);
  std::stringstream svg;
  svg << std::ifstream(comparison.svg_path).rdbuf();
  size_t polylines = 0;
  for (size_t at = svg.str().find("<polyline"); at != std::string::npos; at = svg.str().find("<polyline", at + 1))
    ++polylines;
  EXPECT_EQ(polylines, 5u);
  EXPECT_THROW(parse_precision_list("fp32,fp9"), Error);
  EXPECT_THROW(parse_precision_list("fp8,fp8"), Error);
}

TEST_F(PrecisionTraining, CommandLineWritesTheCurves) {
  const std::string out = dir_.file("cli");
  std::string output;
  const std::string command = test::binary_path() +
                              " compare-precision --formats fp32,fp8 --steps 2 -d cpu -b 4 -s 32 -o " + out +
                              " --set model.hidden=64 --set model.heads=2 --set model.kv_heads=1 --set model.layers=2"
                              " --set model.ffn_hidden=128 --set data.val= --set data.train=" +
                              corpus_ + "/train_*.bin";
  ASSERT_EQ(test::run_command(command, &output), 0) << output;
  EXPECT_NE(output.find("Using FP8 recipe: DelayedScaling"), std::string::npos) << output;
  EXPECT_NE(output.find("vs fp32"), std::string::npos) << output;
  EXPECT_TRUE(std::filesystem::exists(out + "/loss_curves.svg"));
  EXPECT_NE(test::run_command(test::binary_path() + " compare-precision --formats fp32,int3 -d cpu", &output), 0);
  EXPECT_NE(output.find("int3"), std::string::npos) << output;
}

}  // namespace
}  // namespace mxtrain
namespace mxtrain {
namespace {

// The optimizer's FP8 weight copies come back, from the second step on, to the addresses the
// forward took the last ones from (Quantizer::prepare_weight_cast, settle_weight_casts), so a
// captured step graph keeps replaying: llama-1b 8x2048 and llama-3b 4x2048 fp8 on the dryrun,
// whose allocations are the CUDA backend's. The tiny Llama's small copies do not settle (each
// step graph of it is captured again: tests/cuda/cuda_step_test.cpp).
TEST(Precision, OptimizerWeightCopiesKeepTheirAddressesFromStepToStep) {
  struct Case {
    const char* preset;
    int64_t batch;
    bool settles;
  };
  for (const Case c : {Case{"llama-1b", 8, true}, Case{"llama-3b", 4, true}, Case{"tiny", 2, false}}) {
    RunConfig config;
    config.model = model_preset(c.preset);
    config.train.device = "cuda";
    config.train.precision = "fp8";
    config.train.micro_batch_size = c.batch;
    config.train.seq_len = c.settles ? 2048 : 64;
    config.train.gemm_autotune = false;
    config.optimizer.grad_clip = 0;
    CudaAllocationModel cuda_model;
    cuda_model.enabled = true;
    DryrunBackend backend(0, "h200", cuda_model);
    backend.set_native_quantized_gemms({DType::e4m3});
    const PrecisionPlan plan = resolve_precision(config.train.precision, "cuda", false);
    TrainingSession session(config, backend, plan, make_parameter_store(backend, config, plan, nullptr, 1));
    const std::vector<TokenBatch> batch(1, TokenBatch{nullptr, nullptr, c.batch, config.train.seq_len});
    for (int64_t step = 1; step <= 4; ++step) {
      session.step(batch, c.batch * config.train.seq_len, 1e-3, step);
      // The first step's forwards cast the weights themselves: nothing to repeat.
      EXPECT_EQ(session.model().linears().weight_casts_repeat(), step > 1 && c.settles) << c.preset << " step " << step;
    }
  }
}

}  // namespace
}  // namespace mxtrain
