// SwiGLU and GELU (tanh approximation), forward and backward, elementwise in f32. The formulas
// are written in the same order of operations as PyTorch's CPU kernels (F.silu as x/(1+e^-x);
// GELU's kBeta·(x + kKappa·x³) and its exact derivative), so the two agree to a few ulps. The
// backward recomputes the activation from its saved input instead of keeping the output.
#include <cmath>

#include "mxtrain/backend/cpu/cpu_backend.hpp"
#include "mxtrain/backend/cpu/cpu_internal.hpp"

namespace mxtrain {
namespace {

constexpr float kGeluBeta = 0.7978845608028654f;  // sqrt(2/pi)
constexpr float kGeluKappa = 0.044715f;

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

void CpuBackend::impl_swiglu_forward(const Tensor& gate_up, const Tensor& out, const Tensor&) {
  cpu::require_f32("swiglu_forward", {&gate_up, &out});
  const int64_t features = out.cols();
  const float* input = gate_up.ptr<float>();
  float* output = out.ptr<float>();
  cpu::parallel_rows(threads_, out.rows(), [&](int64_t row) {
    const float* pair = input + row * 2 * features;  // gate c at 2c, up c at 2c + 1
    float* out_row = output + row * features;
    for (int64_t c = 0; c < features; ++c) {
      const float gate = pair[2 * c], up = pair[2 * c + 1];
      out_row[c] = gate / (1.0f + std::exp(-gate)) * up;
    }
  });
}

void CpuBackend::impl_swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up,
                                      const Tensor&) {
  cpu::require_f32("swiglu_backward", {&dout, &gate_up, &dgate_up});
  const int64_t features = dout.cols();
  const float* grad = dout.ptr<float>();
  const float* input = gate_up.ptr<float>();
  float* dinput = dgate_up.ptr<float>();
  cpu::parallel_rows(threads_, dout.rows(), [&](int64_t row) {
    const float* pair = input + row * 2 * features;  // gate c at 2c, up c at 2c + 1
    const float* grad_row = grad + row * features;
    float* dpair = dinput + row * 2 * features;
    for (int64_t c = 0; c < features; ++c) {
      const float gate = pair[2 * c], up = pair[2 * c + 1];
      const float s = sigmoid(gate);
      const float silu = gate * s;
      const float g = grad_row[c];
      dpair[2 * c] = g * up * (s * (1.0f + gate * (1.0f - s)));
      dpair[2 * c + 1] = g * silu;
    }
  });
}

void CpuBackend::impl_gelu_forward(const Tensor& x, const Tensor& out, const Tensor&) {
  cpu::require_f32("gelu_forward", {&x, &out});
  const float* input = x.ptr<float>();
  float* output = out.ptr<float>();
  cpu::parallel_blocks(threads_, x.numel(), cpu::kElementBlock, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = input[i];
      const float inner = kGeluBeta * (v + kGeluKappa * (v * v * v));
      output[i] = 0.5f * v * (1.0f + std::tanh(inner));
    }
  });
}

void CpuBackend::impl_gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, const Tensor&) {
  cpu::require_f32("gelu_backward", {&dout, &x, &dx});
  const float* grad = dout.ptr<float>();
  const float* input = x.ptr<float>();
  float* dinput = dx.ptr<float>();
  cpu::parallel_blocks(threads_, x.numel(), cpu::kElementBlock, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float v = input[i];
      const float square = v * v;
      const float inner = kGeluBeta * (v + kGeluKappa * square * v);
      const float tanh_inner = std::tanh(inner);
      const float left_derivative = 0.5f * (1.0f + tanh_inner);
      const float right_derivative =
          0.5f * v * (1.0f - tanh_inner * tanh_inner) * kGeluBeta * (1.0f + 3.0f * kGeluKappa * square);
      dinput[i] = grad[i] * (left_derivative + right_derivative);
    }
  });
}

}  // namespace mxtrain
