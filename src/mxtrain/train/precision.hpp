// The precision recipe of a run, resolved once from train.precision, the [precision] section and
// the backend: which dtype activations, compute weights and gradients use, how the blocks' linear
// GEMMs run (model/linear_recipe.hpp), whether FP16 loss scaling is on, and the start-up line that
// says all of it. The names (fp32, bf16, fp16, fp8, fp8-current, mxfp8, nvfp4) are what
// train.precision and the planner's precision lists take.
#pragma once
#include <string>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/config/run_config.hpp"
#include "mxtrain/core/dtype.hpp"
#include "mxtrain/model/linear_recipe.hpp"

namespace mxtrain {

struct PrecisionPlan {
  std::string name;                  // "fp32", "bf16", "fp16", "fp8", "fp8-current", "mxfp8", "nvfp4"
  DType activation = DType::f32;
  DType compute = DType::f32;        // weights as the GEMMs read them
  DType grad = DType::f32;           // gradient accumulation
  LinearFormat linear = LinearFormat::high_precision;  // the blocks' linear GEMMs
  bool loss_scaling = false;         // fp16: dynamic loss scaling (train/loss_scaler.hpp)
  std::string startup_line;          // printed at start
};

// Every name train.precision accepts but "auto", in the order of the docs.
const std::vector<std::string>& precision_names();

// device is the resolved device ("cpu" or "cuda"). Throws Error(config) for combinations the
// device cannot run, with the fix. The start-up line is generic; the overload below names the
// recipe's settings and whether the backend runs it natively or emulated.
PrecisionPlan resolve_precision(const std::string& requested, const std::string& device, bool tf32);
PrecisionPlan resolve_precision(const RunConfig& config, const Backend& backend);

// The dtype of the blocks' weight gradients (precision.grad_dtype) in a run of world_size
// processes. auto: BF16 when the run is bf16, fp8 or fp8-current on the GPU, on one process,
// with one micro-batch a step: each gradient is then one GEMM's (or column sum's) output,
// written once and read by the norm and the optimizer, and BF16 is what torch autocast leaves it
// as (a BF16 GEMM's output; a PyTorch FP8 linear's FP32 wgrad rounded to the BF16 weight cast it
// was taken for); F32 otherwise (accumulation over micro-batches, FSDP's reductions, the emulated block
// formats, the CPU). The embedding and head groups stay in plan.grad: their gradients are sums
// of several writes a step (the head's token chunks, a tied embedding). Throws Error(config) for
// bf16 where it would round sums or the run cannot have it.
DType block_grad_dtype(const RunConfig& config, const PrecisionPlan& plan, int world_size);

// Whether the quantized blocks keep no compute copy of their weights (precision.quantized_weights):
// true or false as asked; auto = true for a quantized recipe on one process, where it saves 2
// bytes a quantized parameter at the speed of the copy (each cast reads the FP32 master instead
// of the BF16 copy, and the optimizer writes no copy), false under FSDP, which does not support
// it yet. Always false for the high-precision formats.
bool uses_quantized_weights(const RunConfig& config, const PrecisionPlan& plan, bool sharded);

// The dtype whose dense peak MFU is measured against: FP8 for the per-tensor FP8 recipes (their
// GEMMs run on the FP8 tensor cores, as TE and NeMo report), the activation dtype otherwise.
DType mfu_dtype(const PrecisionPlan& plan);

// The linear recipe's settings from config.precision for a resolved plan (bf16_*_layers "auto"
// resolved against model.layers).
LinearRecipeOptions linear_recipe_options(const RunConfig& config, const PrecisionPlan& plan);

}  // namespace mxtrain
