// AdamW on a flat f32 master tensor, matching torch.optim.AdamW's single-tensor path
// (foreach=False, fused=False) operation by operation: the scalars are formed in double as
// Python forms them and rounded to f32 where torch hands them to an f32 kernel, and each tensor
// op keeps torch's CPU kernel's order of operations:
//   p *= (1 - lr·wd)                       (elements [0, decay_count) only)
//   m = lerp(m, g, 1 - β1)                 (torch's lerp: m + w·(g - m) for w < 0.5)
//   v = v·β2 + ((1 - β2)·g)·g              (mul_, then addcmul_)
//   p = p + (-lr/bc1 · m) / (sqrt(v)/sqrt(bc2) + eps)   (addcdiv_)
// g = grad · grad_multiplier · clip with clip as torch.nn.utils.clip_grad_norm_ computes it in
// f32: min(1, max_norm / (sqrt(norm²) + 1e-6)). Elementwise, so any split over threads is exact.
// Without clipping the pass can also leave the squared gradient norm (AdamWArgs::grad_norm_output).
// A split master (AdamWArgs::master_low) is joined before the update and split after it.
#include <cmath>
#include <vector>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"
#include "mxtrain/numerics/split_master.hpp"

namespace mxtrain {
namespace {

// torch's scalar lerp (aten/src/ATen/native/Lerp.h).
inline float lerp(float start, float end, float weight) {
  return std::fabs(weight) < 0.5f ? start + weight * (end - start) : end - (end - start) * (1.0f - weight);
}

}  // namespace

void CpuBackend::impl_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                            const Tensor& compute_copy, const Tensor& grad_norm_sq, const AdamWArgs& args) {
  if (!cpu::is_float_storage(grad.dtype)) cpu::throw_unsupported("adamw", grad.dtype);
  if (compute_copy.defined() && !cpu::is_float_storage(compute_copy.dtype))
    cpu::throw_unsupported("adamw", compute_copy.dtype);
  const bool split = args.master_low.defined();  // the master as (compute_copy, master_low)
  cpu::require_f32("adamw", {&m, &v, &grad_norm_sq});
  if (!split) cpu::require_f32("adamw", {&param});
  MXTRAIN_ASSERT(args.step >= 1, "adamw: step %lld must be >= 1", static_cast<long long>(args.step));

  float clip = 1.0f;
  if (args.max_grad_norm > 0) {
    const float norm = std::sqrt(grad_norm_sq.ptr<float>()[0]);
    const float coefficient = args.max_grad_norm / (norm + 1e-6f);
    clip = coefficient < 1.0f ? coefficient : 1.0f;
  }
  AdamWStepFactors factors = adamw_step_factors(args);
  if (args.step_factors.defined()) {
    const float* f = args.step_factors.ptr<float>();
    factors = AdamWStepFactors{f[0], f[1], f[2]};
  }
  const float decay_factor = factors.decay_factor;
  const float m_weight = static_cast<float>(1.0 - static_cast<double>(args.beta1));
  const float beta2_f = args.beta2;
  const float v_weight = static_cast<float>(1.0 - static_cast<double>(args.beta2));
  const float negative_step_size = factors.negative_step_size;
  const float bias_correction2_sqrt = factors.bias_correction2_sqrt;
  const float epsilon = args.epsilon;
  const float multiplier = args.grad_multiplier;

  float* p = split ? nullptr : param.ptr<float>();
  uint16_t* high = split ? compute_copy.ptr<uint16_t>() : nullptr;
  uint16_t* low = split ? args.master_low.ptr<uint16_t>() : nullptr;
  const int64_t count = grad.numel();
  float* first = m.ptr<float>();
  float* second = v.ptr<float>();
  const int64_t decay_count = args.decay_count;
  // The squared norm, when asked for, as impl_sum forms it: a double per element block, added in
  // block order.
  const bool norm_out = args.grad_norm_output != AdamWArgs::NormOutput::none;
  std::vector<double> partials(norm_out ? static_cast<size_t>((count + cpu::kElementBlock - 1) / cpu::kElementBlock)
                                        : 0);
  cpu::parallel_blocks(threads_, count, cpu::kElementBlock, [&](int64_t begin, int64_t end) {
    double squares = 0;
    for (int64_t i = begin; i < end; ++i) {
      const float g = cpu::load_as_float(grad.data, grad.dtype, i) * multiplier * clip;
      squares += static_cast<double>(g) * g;
      float weight = split ? numerics::join_master(high[i], low[i]) : p[i];
      if (i < decay_count) weight *= decay_factor;
      first[i] = lerp(first[i], g, m_weight);
      second[i] = second[i] * beta2_f + v_weight * g * g;
      const float denominator = std::sqrt(second[i]) / bias_correction2_sqrt + epsilon;
      weight = weight + negative_step_size * first[i] / denominator;
      if (split) {
        const numerics::SplitMaster halves = numerics::split_master(weight);
        high[i] = halves.high;
        low[i] = halves.low;
        continue;
      }
      p[i] = weight;
      if (!compute_copy.defined()) continue;
      switch (compute_copy.dtype) {
        case DType::bf16: compute_copy.ptr<uint16_t>()[i] = float_to_bf16(weight); break;
        case DType::f16: compute_copy.ptr<uint16_t>()[i] = float_to_f16(weight); break;
        default: compute_copy.ptr<float>()[i] = weight; break;
      }
    }
    if (norm_out) partials[static_cast<size_t>(begin / cpu::kElementBlock)] = squares;
  });
  if (!norm_out) return;
  double total = args.grad_norm_output == AdamWArgs::NormOutput::add ? grad_norm_sq.ptr<float>()[0] : 0.0;
  for (double partial : partials) total += partial;
  grad_norm_sq.ptr<float>()[0] = static_cast<float>(total);
}

}  // namespace mxtrain
