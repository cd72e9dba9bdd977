#include "mxtrain/train/precision.hpp"

#include "mxtrain/core/error.hpp"

namespace mxtrain {

PrecisionPlan resolve_precision(const std::string& requested, const std::string& device, bool tf32) {
  std::string name = requested == "auto" ? (device == "cuda" ? "bf16" : "fp32") : requested;
  PrecisionPlan plan;
  plan.name = name;
  if (name == "fp32") {
    plan.startup_line = device == "cuda" && tf32 ? "Precision fp32 (TF32 tensor-core GEMMs)"
                                                 : "Precision fp32 (FP32 everywhere)";
    return plan;
  }
  if (name == "bf16") {
    if (device != "cuda")
      throw Error(ErrorKind::config, "precision bf16 needs the cuda backend; the cpu backend computes in FP32",
                  "use --precision fp32 on the CPU, or --device cuda on a GPU machine");
    plan.activation = DType::bf16;
    plan.compute = DType::bf16;
    plan.grad = DType::f32;
    plan.startup_line = "Precision bf16 (BF16 activations and weights, FP32 master weights, gradients and Adam states)";
    return plan;
  }
  throw Error(ErrorKind::config, "precision '" + name + "' is not available in this build",
              "use fp32 or bf16");
}

}  // namespace mxtrain
