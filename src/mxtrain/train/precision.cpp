#include "mxtrain/train/precision.hpp"

#include <algorithm>
#include <cstdlib>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = {"fp32", "bf16", "fp16", "fp8", "fp8-current", "mxfp8", "nvfp4"};
  return names;
}

namespace {

LinearFormat linear_format_of(const std::string& name) {
  if (name == "fp8") return LinearFormat::fp8_delayed;
  if (name == "fp8-current") return LinearFormat::fp8_current;
  if (name == "mxfp8") return LinearFormat::mxfp8;
  if (name == "nvfp4") return LinearFormat::nvfp4;
  return LinearFormat::high_precision;
}

int64_t layer_count(const std::string& text, int64_t automatic) {
  return text == "auto" ? automatic : std::strtoll(text.c_str(), nullptr, 10);
}

}  // namespace

PrecisionPlan resolve_precision(const std::string& requested, const std::string& device, bool tf32) {
  std::string name = requested == "auto" ? (device == "cuda" ? "bf16" : "fp32") : requested;
  PrecisionPlan plan;
  plan.name = name;
  if (name == "fp32") {
    plan.startup_line = device == "cuda" && tf32 ? "Precision fp32 (TF32 tensor-core GEMMs)"
                                                 : "Precision fp32 (FP32 everywhere)";
    return plan;
  }
  if (name == "bf16" || name == "fp16") {
    if (device != "cuda")
      throw Error(ErrorKind::config,
                  "precision " + name + " needs the cuda backend; the cpu backend computes in FP32",
                  "use --precision fp32 on the CPU (fp8, mxfp8 and nvfp4 are emulated there too), or --device cuda on "
                  "a GPU machine");
    plan.activation = plan.compute = name == "bf16" ? DType::bf16 : DType::f16;
    plan.grad = DType::f32;
    plan.loss_scaling = name == "fp16";
    plan.startup_line =
        name == "bf16"
            ? "Precision bf16 (BF16 activations and weights, FP32 master weights and Adam states)"
            : "Precision fp16 (FP16 activations and weights, FP32 master weights, gradients and Adam states; dynamic "
              "loss scaling)";
    return plan;
  }
  plan.linear = linear_format_of(name);
  if (plan.linear == LinearFormat::high_precision) {
    std::string names;
    for (const std::string& known : precision_names()) names += (names.empty() ? "" : ", ") + known;
    throw Error(ErrorKind::config, "precision '" + name + "' is not known", "use one of: auto, " + names);
  }
  // Quantized linear GEMMs; everything else in BF16 on the GPU, in FP32 on the CPU (its oracle).
  if (device == "cuda") plan.activation = plan.compute = DType::bf16;
  plan.grad = DType::f32;
  plan.startup_line = "Precision " + name + " (" + linear_format_name(plan.linear) + " in the blocks' linear GEMMs, " +
                      (device == "cuda" ? "BF16" : "FP32") + " elsewhere)";
  return plan;
}

DType block_grad_dtype(const RunConfig& config, const PrecisionPlan& plan, int world_size) {
  const std::string& asked = config.precision.grad_dtype;
  if (asked == "f32") return DType::f32;
  const int64_t micro = config.train.micro_batch_size;
  const int64_t global = config.train.global_batch(world_size);
  const bool one_micro_batch = global == micro * world_size;
  // The per-tensor FP8 recipes' wgrad GEMMs accumulate in FP32 and round once into the
  // gradient, as the BF16 GEMM does (computing on the GPU: BF16 activations).
  const bool fp8_run = (plan.linear == LinearFormat::fp8_delayed || plan.linear == LinearFormat::fp8_current) &&
                       plan.compute == DType::bf16;
  const bool recipe_allows = plan.name == "bf16" || fp8_run;
  if (asked != "bf16") return recipe_allows && world_size == 1 && one_micro_batch ? DType::bf16 : DType::f32;
  if (!recipe_allows)
    throw Error(ErrorKind::config,
                "precision.grad_dtype = bf16 needs the bf16 precision, or fp8 or fp8-current on the GPU; this run is " +
                    plan.name + " computing in " + std::string(dtype_name(plan.compute)),
                "use precision.grad_dtype = auto or f32, or --precision bf16");
  if (world_size > 1)
    throw Error(ErrorKind::config,
                strf("precision.grad_dtype = bf16 is for one process; FSDP over %d ranks accumulates and reduces f32 "
                     "gradients", world_size),
                "use precision.grad_dtype = auto or f32 (dist.reduce_dtype = bf16 makes the reductions bf16)");
  if (!one_micro_batch)
    throw Error(ErrorKind::config,
                strf("precision.grad_dtype = bf16 would add %lld micro-batches' gradients in BF16 (global batch %lld, "
                     "micro-batch %lld)",
                     static_cast<long long>(global / micro), static_cast<long long>(global),
                     static_cast<long long>(micro)),
                "use precision.grad_dtype = auto or f32 with gradient accumulation");
  return DType::bf16;
}

DType mfu_dtype(const PrecisionPlan& plan) {
  const bool fp8 = plan.linear == LinearFormat::fp8_delayed || plan.linear == LinearFormat::fp8_current;
  return fp8 && plan.activation != DType::f32 ? DType::e4m3 : plan.activation;
}

bool uses_quantized_weights(const RunConfig& config, const PrecisionPlan& plan, bool sharded) {
  if (plan.linear == LinearFormat::high_precision || plan.compute == DType::f32) return false;
  const std::string& asked = config.precision.quantized_weights;
  return asked == "true" || (asked == "auto" && !sharded);
}

LinearRecipeOptions linear_recipe_options(const RunConfig& config, const PrecisionPlan& plan) {
  const PrecisionConfig& p = config.precision;
  LinearRecipeOptions options;
  options.format = plan.linear;
  options.fp8_formats = p.fp8_format == "hybrid" ? Fp8Formats::hybrid
                        : p.fp8_format == "e4m3" ? Fp8Formats::e4m3
                                                 : Fp8Formats::automatic;
  options.amax_history_length = static_cast<int>(p.amax_history_len);
  options.amax_algorithm =
      p.amax_compute_algo == "most_recent" ? numerics::AmaxAlgorithm::most_recent : numerics::AmaxAlgorithm::max;
  options.margin = static_cast<int>(p.margin);
  options.mx_round_up = p.mx_scale_rounding == "rceil";
  options.nvfp4_hadamard = p.nvfp4_rht;
  options.nvfp4_stochastic_rounding = p.nvfp4_stochastic_rounding;
  options.nvfp4_weight_tiles = p.nvfp4_2d_weights;
  options.optimizer_weight_casts = p.fp8_optimizer_weight_casts;
  // NVIDIA's NVFP4 Llama recipes keep the last 4 blocks in BF16; smaller models keep a quarter.
  const int64_t layers = config.model.layers;
  const int64_t last_auto = plan.linear == LinearFormat::nvfp4 ? std::min<int64_t>(4, layers / 4) : 0;
  options.bf16_first_layers = layer_count(p.bf16_first_layers, 0);
  options.bf16_last_layers = layer_count(p.bf16_last_layers, last_auto);
  options.seed = static_cast<uint64_t>(config.train.seed);
  return options;
}

PrecisionPlan resolve_precision(const RunConfig& config, const Backend& backend) {
  const std::string device = backend.device() == Device::cpu ? "cpu" : "cuda";
  PrecisionPlan plan = resolve_precision(config.train.precision, device, config.train.tf32);
  if (plan.linear != LinearFormat::high_precision) {
    plan.startup_line = describe_linear_recipe(linear_recipe_options(config, plan), backend, config.model.layers,
                                               plan.activation);
  }
  if (plan.loss_scaling) {
    const PrecisionConfig& p = config.precision;
    plan.startup_line += strf(" (initial scale %g, x%g after %lld clean steps, x%g and skip on inf/NaN gradients)",
                              p.loss_scale_init, p.loss_scale_growth, static_cast<long long>(p.loss_scale_growth_interval),
                              p.loss_scale_backoff);
  }
  return plan;
}

}  // namespace mxtrain
