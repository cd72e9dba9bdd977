// LinearRecipe: the one place that decides how each linear layer's three GEMMs run — in the
// activation dtype, in per-tensor FP8 (delayed or current scaling), in MXFP8 or in NVFP4 — and
// that owns the scaling state they need. The Transformer calls LinearRecipe::gemm instead of
// Backend::gemm for the blocks' linear layers, so the block diagram stays the same for every
// precision.
//
// The recipe decides per layer whether it is quantized; the format's Quantizer (quantizer.hpp)
// makes the copies and owns the scaling state, and every GEMM is one Backend::gemm call.
//
// Per GEMM (TransformerEngine's roles, docs/numerics-reference.md §2):
//   forward         out  = x · Wᵀ        x rowwise,  W rowwise      (E4M3 x E4M3 under HYBRID)
//   backward_input  dx   = dy · W        dy rowwise, W columnwise   (E5M2 x E4M3)
//   backward_weight dW (+)= dyᵀ · x      dy columnwise, x columnwise (E5M2 x E4M3, FP32 accumulate)
// A columnwise copy is the transposed matrix quantized along its rows, so every quantized GEMM is
// TN (the only FP8 layout Hopper has). Where the backend has the quantized GEMM (supports()) it
// runs natively; elsewhere the operands are quantized, dequantized and multiplied by the
// high-precision GEMM ("emulated"), which the start-up line says.
//
// Memory: operands are quantized when used, into scratch, and freed after their GEMM; nothing
// quantized is kept across ops but the gradient's rowwise copy between backward_weight and
// backward_input of the same layer (one cast-transpose pass makes both copies). The saved
// activation x is re-quantized in backward (TE's save_original_input). Weights are quantized
// from whatever the store hands over: the bf16 compute copy, or with quantized_weights the FP32
// master (no bf16 copy exists then). Delayed-scaling state lives in device buffers allocated
// through the backend (Lifetime::parameter), so the planner sees its bytes.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/model/quantizer.hpp"
#include "mxtrain/numerics/scaling.hpp"

namespace mxtrain {

enum class LinearFormat : uint8_t { high_precision, fp8_delayed, fp8_current, mxfp8, nvfp4 };
const char* linear_format_name(LinearFormat format);

enum class LinearKind : uint8_t { qkv, out, up, down };
constexpr int kLinearKinds = 4;
const char* linear_kind_name(LinearKind kind);  // "attn.qkv", "attn.out", "mlp.up", "mlp.down"

// Element formats of FP8 tensors: HYBRID (E4M3 forward, E5M2 gradients) or E4M3 everywhere.
// auto = HYBRID for per-tensor FP8, E4M3 for MXFP8 (TransformerEngine's defaults).
enum class Fp8Formats : uint8_t { automatic, hybrid, e4m3 };

struct LinearRecipeOptions {
  LinearFormat format = LinearFormat::high_precision;
  Fp8Formats fp8_formats = Fp8Formats::automatic;
  int amax_history_length = 1024;  // delayed scaling
  numerics::AmaxAlgorithm amax_algorithm = numerics::AmaxAlgorithm::max;
  int margin = 0;
  bool mx_round_up = true;  // MXFP8 scales: RCEIL (TE, cuBLAS) or OCP floor
  bool nvfp4_hadamard = true, nvfp4_stochastic_rounding = true, nvfp4_weight_tiles = true;
  int64_t bf16_first_layers = 0, bf16_last_layers = 0;  // kept in the activation dtype
  uint64_t seed = 0;        // NVFP4 stochastic rounding streams
  bool allow_native = true; // false: emulate even where the backend has the quantized GEMM
  // Current scaling: the kernels that write a cast's input record its amax (amax_record);
  // false: every cast runs its own amax pass (the same values; tests compare the two).
  bool producer_amaxes = true;
  // Delayed scaling: the casts compute their input from the op that writes it where the model
  // hands one over (LinearGemmOptions::producer); false: the model runs the op apart (the same
  // bits; tests compare the two).
  bool fuse_producers = true;
  // Delayed scaling with a local optimizer (the master of every weight on this rank): the
  // optimizer step writes each quantized weight's next rowwise FP8 copy as it updates the
  // weight, and the next forward takes it instead of casting (TransformerEngine's FP8 weights
  // made once per step, here without a pass of their own); false: the forward casts (the same
  // bits; tests compare the two).
  bool optimizer_weight_casts = true;

  // Whether block `layer` of `layers` runs its linear GEMMs quantized.
  bool quantized(int64_t layer, int64_t layers) const;
};

// The start-up line, e.g. "Using FP8 recipe: DelayedScaling(format=HYBRID, amax_history_len=32,
// amax_compute_algo=max, margin=0) ..." or "MXFP8 enabled (block 32, E8M0 scales, emulated on
// sm_90: ...)". Empty for high_precision.
std::string describe_linear_recipe(const LinearRecipeOptions& options, const Backend& backend, int64_t layers,
                                   DType activation);

// What a linear GEMM may need besides Backend::gemm's arguments.
struct LinearGemmOptions {
  // forward of a layer with saves_inputs: the cast of x also writes the columnwise copy the
  // weight gradient needs and keeps it (an activation) until backward_weight, which then takes
  // it instead of x (args.b may be undefined there): TransformerEngine's saved FP8 input. The
  // copy is what backward would have cast from the same x with the same scale, so results do
  // not change; one pass over x and 1 byte an element are kept instead of x's 2.
  bool save_input = false;
  // gelu_aux_bias / swiglu_aux / dgelu: f32 [1] that receives the amax of out (the activation
  // op's out_amax).
  Tensor out_amax{};
  // Where fuses_producers(layer): the op that writes a (the forward's input or the output
  // gradient) — a is then shape and dtype only — run inside a's casts, so a is never written
  // and read back (TransformerEngine's activation kernels with an FP8 output). A backward_weight
  // and the backward_input after it take the same producer; the second reuses the first's
  // rowwise copy. No bias gradient (it sums the written gradient).
  CastProducer producer{};
  // backward_weight where fuses_producers(layer) and no saved input: the op that writes b (the
  // layer's input x; b is then shape and dtype only), run inside x's columnwise cast.
  CastProducer input_producer{};
  // backward_input of a per-tensor FP8 layer, when its backward_weight comes after it: the cast
  // of the gradient also makes the columnwise copy and keeps it for that backward_weight, which
  // then takes it instead of casting the gradient again (same scale, same bits).
  bool keep_gradient_columnwise = false;
};

class LinearRecipe {
 public:
  // Checks that the backend has every op the recipe needs (Error(unsupported) naming the op and
  // dtype otherwise) and allocates the scaling state.
  LinearRecipe(const LinearRecipeOptions& options, Backend& backend, int64_t layers);
  ~LinearRecipe();
  LinearRecipe(const LinearRecipe&) = delete;
  LinearRecipe& operator=(const LinearRecipe&) = delete;


  // GEMM `args` of linear `kind` of block `layer`: Backend::gemm's contract, with the
  // high-precision operands (forward a = x, b = W; backward_input a = dout, b = W;
  // backward_weight a = dout, b = x). A layer in the activation dtype runs it as it is; a
  // quantized layer casts the operands with the format's quantizer and runs the quantized GEMM
  // (native) or the GEMM of their dequantized values (emulated); the residual rides on either's
  // epilogue. Epilogues a quantized GEMM lacks run as ops of their own: GELU and SwiGLU as
  // gelu_forward / swiglu_forward / gelu_backward (those also where an out_amax is to be
  // recorded); the bias gradient as
  // column_sum of the high-precision gradient, as TransformerEngine does.
  void gemm(int64_t layer, LinearKind kind, const GemmArgs& args, const LinearGemmOptions& options = {});
  // Current scaling: where the kernel that writes x — the input (gradient = false), or the output
  // gradient (true), that linear `kind` of block `layer` casts next — records x's amax (the
  // backend ops' out_amax), so that the cast skips its own amax pass over x, as
  // TransformerEngine's norm and activation kernels do for its current-scaling recipe. The next
  // cast of that role takes the record only if it is of the same x; undefined (nothing to
  // record) for other formats and high-precision layers.
  Tensor amax_record(int64_t layer, LinearKind kind, bool gradient, const Tensor& x);
  // Current scaling, right before the optimizer step: the quantized weights cast this step, each
  // with the amax slot where the step may record the amax of its new values (AdamWArgs'
  // weight_amaxes), all slots zeroed here (one fill). The caller reports each weight the step
  // did record (weight_amax_recorded); the next cast of that weight takes the record instead of
  // an amax pass over it. Empty for other formats, or without producer_amaxes.
  using WeightAmax = mxtrain::WeightAmax;
  std::vector<WeightAmax> weight_amaxes();
  void weight_amax_recorded(const WeightAmax& weight);
  // Delayed scaling, right before the optimizer step (optimizer_weight_casts): the next step's
  // scales are computed here, and each quantized weight cast this step comes with the rowwise
  // copy its next forward casts, for the optimizer to write as it updates the weight
  // (AdamWArgs::weight_casts); the caller hands back each one it wrote (weight_cast_written),
  // which the next forward of that linear then takes (Quantizer::weight_casts). Empty for other
  // formats, or once stop_weight_casts.
  using WeightCast = mxtrain::WeightCast;
  std::vector<WeightCast> weight_casts();
  void prepare_weight_cast(WeightCast& cast);  // allocates its copy, right before its update
  void weight_cast_written(WeightCast&& cast);
  // Whether the last step's forward took its weight copies where its optimizer wrote the next
  // ones (a step graph needs the addresses to repeat; the session captures again otherwise).
  bool weight_casts_repeat() const { return !quantizer_ || quantizer_->weight_casts_repeat(); }
  // The forwards cast the weights again from here on (a session whose step graphs never see
  // the copies' addresses repeat).
  void stop_weight_casts();
  // After the optimizer step has written its copies (every gradient freed): copies that could
  // not be placed where the forward took the last ones move there (Quantizer::settle_weight_casts).
  void settle_weight_casts() {
    if (quantizer_) quantizer_->settle_weight_casts();
  }
  // Whether forward can keep block `layer`'s quantized inputs (per-tensor FP8 layers), and
  // whether it holds one for this linear now.
  bool saves_inputs(int64_t layer) const;
  bool has_saved_input(int64_t layer, LinearKind kind) const;
  // Whether block `layer`'s casts take a fused producer (LinearGemmOptions::producer): delayed
  // scaling, whose scale is known before the pass.
  bool fuses_producers(int64_t layer) const;
  // Where fuses_producers(layer), for a producer that also writes the columnwise copy of linear
  // `kind`'s input x (x: shape and dtype only) beside its own cast — SwiGLU's backward writes the
  // down projection's input, the activation, from the gate_up it reads anyway
  // (CastProducer::act_columnwise): allocates that copy and puts it, with the scale and amax slot
  // the input's cast would use, into `producer`; that linear's backward_weight then takes it as a
  // saved input (the same bits as casting there).
  void produce_input_copy(int64_t layer, LinearKind kind, const Tensor& x, CastProducer& producer);

  // After the optimizer step: delayed scaling computes the next step's scales from the amax
  // histories and rolls them (§2.1) unless weight_casts did; the stochastic-rounding streams
  // move on.
  void finish_step();
  // Whether a step's launches are the same from step to step (Quantizer::step_invariant), so a
  // session may capture one in a CUDA graph and replay it (train.cuda_graph).
  bool step_graph_capturable() const { return !quantizer_ || quantizer_->step_invariant(); }

  // Error(unsupported) with the fix when a quantized layer's GEMM shapes (rows = tokens per
  // micro-batch) do not meet the format's divisibility; called before step 1.
  void check_shapes(int64_t rows, int64_t in_features, int64_t out_features, LinearKind kind) const;

  bool quantized(int64_t layer) const { return options_.quantized(layer, layers_); }
  bool native() const { return native_; }
  const LinearRecipeOptions& options() const { return options_; }
  // finish_step calls: steps run op by op or captured (a replayed graph runs no host code).
  int64_t steps() const { return steps_; }

  // Delayed-scaling state (tests and checkpoints): slot-major [history, 2·linears] for inputs and
  // weights (tensor 2i = input, 2i+1 = weight of linear i = layer·4 + kind), [history, linears]
  // for output gradients; scales likewise. Undefined for other formats.
  const Tensor& forward_history() const;
  const Tensor& backward_history() const;
  const Tensor& forward_scale() const;
  const Tensor& backward_scale() const;
  // Current-scaling amaxes [1, 3·linears]: input, weight and gradient of linear i at 3i, 3i+1,
  // 3i+2. Undefined for other formats.
  const Tensor& current_amax() const;

  // What a bit-identical resume needs of the recipe besides the weights (checkpoints save it):
  // named device buffers (delayed scaling's histories and scales) and the random streams drawn
  // so far (NVFP4's stochastic rounding). None for the other formats.
  std::vector<std::pair<std::string, Tensor>> resume_state() const;
  // Around a held-out evaluation (Quantizer::begin_evaluation).
  void begin_evaluation() {
    if (!quantizer_) return;
    quantizer_->begin_evaluation();
    quantizer_->set_evaluating(true);
  }
  void end_evaluation() {
    if (!quantizer_) return;
    quantizer_->end_evaluation();
    quantizer_->set_evaluating(false);
  }
  uint64_t rounding_streams() const { return quantizer_ ? quantizer_->rounding_streams() : 0; }
  void set_rounding_streams(uint64_t streams) {
    if (quantizer_) quantizer_->set_rounding_streams(streams);
  }

 private:
  using Operand = QuantizedOperand;

  // gemm by role and epilogue.
  void forward(int64_t layer, LinearKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias,
               const Tensor& out, bool save_input, const CastProducer& producer = {}, const Tensor& residual = {});
  void backward_weight(int64_t layer, LinearKind kind, const Tensor& dout, const Tensor& x, const Tensor& dweight,
                       const Tensor& dbias, bool accumulate, const CastProducer& producer,
                       const CastProducer& input_producer);
  void backward_input(int64_t layer, LinearKind kind, const Tensor& dout, const Tensor& weight, const Tensor& dx,
                      bool accumulate, const CastProducer& producer = {}, bool keep_gradient_columnwise = false);
  void forward_gelu(int64_t layer, LinearKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias,
                    const Tensor& pre, const Tensor& out, const Tensor& out_amax);
  void forward_swiglu(int64_t layer, LinearKind kind, const Tensor& x, const Tensor& weight, const Tensor& pre,
                      const Tensor& out, const Tensor& out_amax);
  void backward_input_gelu(int64_t layer, LinearKind kind, const Tensor& dout, const Tensor& weight,
                           const Tensor& pre, const Tensor& dx, const Tensor& dx_amax, const Tensor& dbias,
                           bool accumulate_dbias);

  Operand quantize(const Tensor& x, int64_t linear, QuantizedRole role, bool rowwise, bool columnwise,
                   const std::string& name, bool reuse_scale = false,
                   Lifetime columnwise_lifetime = Lifetime::scratch, const CastProducer& producer = {});
  Buffer dequantized(const QuantizedTensor& q, DType dtype, const std::string& name);
  Tensor bias_as(const Tensor& bias, DType dtype, Buffer& storage);
  std::string name_of(int64_t layer, LinearKind kind) const;

  LinearRecipeOptions options_;
  Backend& backend_;
  int64_t layers_;
  bool native_ = false;
  bool weight_casts_stopped_ = false;
  int64_t steps_ = 0;
  // The format's quantizer (none for high_precision): every format-specific rule and state.
  std::unique_ptr<Quantizer> quantizer_;
  // The gradient's quantized copies between backward_weight and backward_input.
  struct GradientStash;
  std::unique_ptr<GradientStash> stash_;
  // The gradient's columnwise copy kept by backward_input (keep_gradient_columnwise) for the
  // backward_weight after it.
  std::unique_ptr<GradientStash> column_stash_;
  // Inputs' columnwise copies kept by forward(save_input) for backward_weight, per linear.
  std::vector<std::unique_ptr<Operand>> saved_inputs_;
};

}  // namespace mxtrain
