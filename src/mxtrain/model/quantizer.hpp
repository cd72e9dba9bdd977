// Quantizers: one per number format of the blocks' linear GEMMs — per-tensor FP8 with delayed
// scaling, per-tensor FP8 with current scaling, MXFP8 and NVFP4 (docs/numerics-reference.md
// §2). A quantizer turns a tensor of a linear layer into the quantized copies Backend::gemm
// reads: it picks each copy's QuantizeSpec, allocates the copy, forms or looks up its scale, runs
// Backend::quantize, and it owns its format's scaling state (delayed scaling's amax histories,
// current scaling's amaxes and scales, NVFP4's stochastic-rounding streams). LinearRecipe picks
// the quantizer of the run's format once and, per layer, calls it and gemm: what differs between
// the formats lives behind this interface.
//
// Every cast allocates, runs amax and quantize ops in the order the recipe always did (scale or
// amax first, then per copy — rowwise before columnwise — data, scales and, for NVFP4, the amax),
// so the planner sees the same trace.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/numerics/scaling.hpp"

namespace mxtrain {

// Which tensor of a linear layer a cast is of: it picks the element format (E5M2 gradients
// under HYBRID) and the scaling slot.
enum class QuantizedRole : uint8_t { input, weight, gradient };

// The quantized copies of one tensor, with the buffers behind them.
struct QuantizedOperand {
  Buffer row_data, row_scales, row_amax, col_data, col_scales, col_amax;
  QuantizedTensor rowwise, columnwise;
  // Moves the columnwise copy and its buffers out, into an operand of their own.
  QuantizedOperand take_columnwise();
};

// One cast of a tensor of linear `linear` (layer · 4 + kind) into its rowwise and/or columnwise
// copy, named name + ".rowwise" / ".columnwise".
struct QuantizeRequest {
  int64_t linear = 0;
  QuantizedRole role = QuantizedRole::input;
  bool rowwise = false, columnwise = false;
  std::string name;
  // Current scaling: when this linear's scale for the role was computed from this very tensor
  // earlier (the forward's input again in backward, a weight again within one step), take it
  // instead of another amax pass; the values are the same, so is the scale.
  bool reuse_scale = false;
  Lifetime columnwise_lifetime = Lifetime::scratch;
  // The op that writes x, fused into the cast (fuses_producers() only): x is shape and dtype.
  CastProducer producer{};
};

// A weight cast this step with the amax slot where the optimizer may record its new amax
// (current scaling; LinearRecipe::weight_amaxes).
struct WeightAmax {
  int64_t linear = 0;
  Tensor weight;  // as the casts saw it (a view of the store's compute copy or master)
  Tensor amax;    // f32 [1]
};

// A weight the optimizer step casts as it writes the new values (delayed scaling): the rowwise
// copy the next forward of its linear would cast, with that cast's scale and amax slot
// (LinearRecipe::weight_casts).
struct WeightCast {
  int64_t linear = 0;
  Tensor weight;             // as the casts see it (a view of the store's compute copy or master)
  std::string name;          // the cast's (copies are named name + ".rowwise")
  QuantizedOperand operand;  // the rowwise copy to fill (data, scale_inverse): prepare_weight_cast
  Tensor scale, amax;        // f32 [1]: the scale to cast with, the slot the cast records its amax in
};

class Quantizer {
 public:
  virtual ~Quantizer();
  Quantizer(const Quantizer&) = delete;
  Quantizer& operator=(const Quantizer&) = delete;

  // The dtype Backend::supports() is asked with for this format's amax, quantize, dequantize and
  // GEMM (backend.hpp): e4m3 for per-tensor FP8, e8m0 for MXFP8, e2m1 for NVFP4.
  virtual DType format_dtype() const = 0;
  // Per-tensor scaled copies (FP8 with delayed or current scaling): a forward's input cast can
  // also write the columnwise copy the weight gradient reads with the same scale.
  virtual bool per_tensor() const { return false; }
  // The multiple of the block every contracted dimension must be (0: none).
  virtual int64_t block_multiple() const { return 0; }
  // Whether a cast can compute its input from the producing op (QuantizeRequest::producer): the
  // scale must be known before the pass (delayed scaling).
  virtual bool fuses_producers() const { return false; }

  QuantizedOperand quantize(const Tensor& x, const QuantizeRequest& request);
  // fuses_producers() only: the copies quantize(x, request) would make, allocated but not
  // written, with the scale to cast with and the slot to record x's amax in (max=), for an op
  // that casts x itself beside its own output (CastProducer::act_columnwise).
  QuantizedOperand copies_for_producer(const Tensor& x, const QuantizeRequest& request, Tensor* scale, Tensor* amax);

  // Current scaling (nothing elsewhere): the amax slot a kernel that writes x, which this linear
  // casts next in that role, may fill (LinearRecipe::amax_record); the weights cast this step
  // with their amax slots, zeroed (LinearRecipe::weight_amaxes); a weight whose amax the step did
  // record.
  virtual Tensor amax_record(int64_t linear, QuantizedRole role, const Tensor& x);
  virtual std::vector<WeightAmax> weight_amaxes() { return {}; }
  virtual void weight_amax_recorded(const WeightAmax& weight) { (void)weight; }
  // Delayed scaling (nothing elsewhere), right before the optimizer step: computes the next
  // step's scales (finish_step then leaves them) and returns, for each weight cast this step, its
  // next forward's rowwise cast for the step to do (AdamWArgs::weight_casts). The step hands
  // back each copy it wrote (weight_cast_written); the next forward cast of that weight outside an
  // evaluation takes it instead of casting (the same bytes, scale and amax record).
  virtual std::vector<WeightCast> weight_casts() { return {}; }
  // Allocates a cast's copy (right before the update that writes it, so the copies of a step
  // come one group at a time as the gradients they replace go).
  void prepare_weight_cast(WeightCast& cast);
  void weight_cast_written(WeightCast&& cast);
  // After the optimizer step: the step's record of the copies its forward took and its
  // optimizer wrote (see weight_casts_repeat), then the format's own finish_step.
  void end_step();
  // Whether the copies the last step's forward took lay where its optimizer wrote the next ones
  // (a step graph replays with the addresses of its capture, so it needs them to); true when
  // neither happened.
  bool weight_casts_repeat() const { return weight_casts_repeat_; }
  // Drops the copies written for the next forward (its casts then run).
  void drop_weight_casts();
  // After the optimizer step wrote its copies, with every gradient freed: each copy that could
  // not be allocated where this step's forward took the last one (a gradient lay there then)
  // moves there now where that memory is free (a device copy), so that from step to step the
  // forward reads its copies at the same addresses (what a step graph needs).
  void settle_weight_casts();  void set_evaluating(bool evaluating) { evaluating_ = evaluating; }
  // Whether every step launches the same casts with the same arguments, so a step can be
  // captured in a CUDA graph and replayed: the decisions the host takes between casts (current
  // scaling's recorded amaxes and reused scales) are the same from the second step on, and the
  // scaling state lives in device buffers. Not where a cast's arguments change from step to
  // step (NVFP4's stochastic rounding draws a new stream offset per gradient cast).
  virtual bool step_invariant() const { return true; }

  // What a bit-identical resume needs besides the parameters, saved in checkpoints: device
  // buffers, each by a stable name (delayed scaling's histories and scales), and the count of
  // random streams drawn (NVFP4's stochastic rounding takes a new stream per gradient cast).
  virtual std::vector<std::pair<std::string, Tensor>> resume_state() const { return {}; }
  // Around a held-out evaluation's forward passes: what they record must not reach the training
  // state (delayed scaling's amax records, which are maxima, would raise the next step's scales
  // and make a run's trajectory depend on its evaluation schedule).
  virtual void begin_evaluation() {}
  virtual void end_evaluation() {}
  virtual uint64_t rounding_streams() const { return 0; }
  virtual void set_rounding_streams(uint64_t streams) { (void)streams; }

 protected:
  Quantizer(Backend& backend, DType forward_element, DType gradient_element);
  DType element(QuantizedRole role) const {
    return role == QuantizedRole::gradient ? gradient_element_ : forward_element_;
  }
  // The spec of one copy; called once per copy in the order they are made (rowwise first).
  virtual QuantizeSpec spec(QuantizedRole role, bool columnwise) = 0;
  // Per-tensor FP8, before the copies are made: the scale the cast uses, the slot where the cast
  // records x's amax (delayed), or the amax the cast forms its scale from (current).
  virtual void cast_scale(const Tensor& x, const QuantizeRequest& request, Tensor* scale, Tensor* amax_out,
                          ScaleFromAmax* from);
  // After a copy's data and scales are allocated (NVFP4: the amax its global scale comes from).
  virtual void copy_amax(const Tensor& x, const std::string& copy, bool transposed, QuantizedOperand& operand,
                         Buffer& amax, QuantizedTensor& q);
  // After the optimizer step (end_step).
  virtual void finish_step() {}
  // The cast itself: scale, copies, Backend::quantize.
  QuantizedOperand quantize_now(const Tensor& x, const QuantizeRequest& request);
  // A cast's scale, amax slot (cast_scale) and copies, allocated but not written: quantize_now's
  // first half, and all of copies_for_producer.
  QuantizedOperand prepare_copies(const Tensor& x, const QuantizeRequest& request, Tensor* scale, Tensor* amax,
                                  ScaleFromAmax* from);
  // Allocates the rowwise (or columnwise) copy of x named name + ".rowwise" (".columnwise"), its
  // data and scales at the addresses given where that memory is free.
  void allocate_copy(const Tensor& x, const QuantizeRequest& request, bool transposed, QuantizedOperand& operand,
                     const void* data_at = nullptr, const void* scales_at = nullptr);

  Backend& backend_;
  DType forward_element_, gradient_element_;

 private:
  struct Ready {
    const void* source = nullptr;  // the weight tensor the copy is of
    QuantizedOperand operand;
  };
  std::map<int64_t, Ready> ready_;  // by linear
  // This step's copies taken by a forward and written by the optimizer: (linear, data, scale).
  struct CopyAddress {
    int64_t linear = 0;
    Tensor data, scale;  // views (the buffers may be gone)
    std::string name;    // the copy's buffer name (unsettled_)
    auto key() const { return std::make_tuple(linear, data.data, scale.data); }
    bool operator<(const CopyAddress& other) const { return key() < other.key(); }
    bool operator==(const CopyAddress& other) const { return key() == other.key(); }
  };
  std::vector<CopyAddress> taken_, written_;
  std::vector<CopyAddress> unsettled_;  // copies written elsewhere than asked: where they belong
  bool weight_casts_repeat_ = true;
  bool evaluating_ = false;
};

// Per-tensor FP8, delayed scaling (§2.1): each cast uses the scale computed after the last step
// from the amax history and records its amax in history slot 0; finish_step updates the scales
// and rolls the histories. State in device buffers (Lifetime::parameter): slot-major histories
// [length, 2·linears] of inputs (2i) and weights (2i + 1), [length, linears] of gradients.
class Fp8DelayedQuantizer final : public Quantizer {
 public:
  Fp8DelayedQuantizer(Backend& backend, int64_t linears, DType gradient_element, int history_length,
                      numerics::AmaxAlgorithm algorithm, int margin);
  DType format_dtype() const override { return DType::e4m3; }
  bool per_tensor() const override { return true; }
  bool fuses_producers() const override { return true; }
  std::vector<WeightCast> weight_casts() override;
  const Tensor& forward_history() const { return forward_history_.tensor(); }
  const Tensor& backward_history() const { return backward_history_.tensor(); }
  const Tensor& forward_scale() const { return forward_scale_.tensor(); }
  const Tensor& backward_scale() const { return backward_scale_.tensor(); }
  std::vector<std::pair<std::string, Tensor>> resume_state() const override;
  void begin_evaluation() override;  // holds the newest history slot on the host
  void end_evaluation() override;    // and puts it back

 protected:
  QuantizeSpec spec(QuantizedRole role, bool columnwise) override;
  void cast_scale(const Tensor& x, const QuantizeRequest& request, Tensor* scale, Tensor* amax_out,
                  ScaleFromAmax* from) override;
  void finish_step() override;

 private:
  Tensor newest_forward_slot() const;  // the forward history's slot 0, every linear's entry
  void update_scales();                // the next step's scales from the histories, which roll

  // The weights cast this step, by linear, with their casts' names, for weight_casts.
  struct CastWeight {
    Tensor weight;
    std::string name;
  };
  std::map<int64_t, CastWeight> weights_;
  bool scales_updated_ = false;  // by weight_casts, this step

  numerics::AmaxAlgorithm algorithm_;
  int margin_;
  Buffer forward_history_, forward_scale_, forward_scale_inverse_;
  Buffer backward_history_, backward_scale_, backward_scale_inverse_;
  std::vector<float> held_slot_;  // the forward history's slot 0 during an evaluation
};

// Per-tensor FP8, current scaling (§2.2): each cast forms its scale from the tensor's amax
// (ScaleFromAmax) — an amax pass of its own, unless the kernel that wrote the tensor or the
// optimizer recorded it (producer_amaxes), or the scale is reused. State: amax [1, 3·linears]
// and scale [3·linears] (input, weight, gradient of linear i at 3i, 3i + 1, 3i + 2).
class Fp8CurrentQuantizer final : public Quantizer {
 public:
  Fp8CurrentQuantizer(Backend& backend, int64_t linears, DType gradient_element, bool producer_amaxes);
  DType format_dtype() const override { return DType::e4m3; }
  bool per_tensor() const override { return true; }
  Tensor amax_record(int64_t linear, QuantizedRole role, const Tensor& x) override;
  std::vector<WeightAmax> weight_amaxes() override;
  void weight_amax_recorded(const WeightAmax& weight) override;
  const Tensor& amaxes() const { return amax_.tensor(); }

 protected:
  void finish_step() override;
  QuantizeSpec spec(QuantizedRole role, bool columnwise) override;
  void cast_scale(const Tensor& x, const QuantizeRequest& request, Tensor* scale, Tensor* amax_out,
                  ScaleFromAmax* from) override;

 private:
  bool producer_amaxes_;
  Buffer amax_, scale_;
  // The tensor each scale was computed from (input and weight slots; undefined = none): an
  // input's until the next forward of its linear, a weight's until the end of the step (the
  // weights cast this step, for weight_amaxes).
  std::vector<Tensor> source_;
  // The tensor whose amax a producing kernel recorded in each slot (amax_record), until the cast
  // that takes it.
  std::vector<const void*> recorded_;
};

// MXFP8 (§2.4): one E8M0 scale per 32 elements along K, computed by the cast; RCEIL or OCP
// floor rounding of the scales.
class Mxfp8Quantizer final : public Quantizer {
 public:
  Mxfp8Quantizer(Backend& backend, DType gradient_element, bool round_up, bool swizzled_scales);
  DType format_dtype() const override { return DType::e8m0; }
  int64_t block_multiple() const override { return 32; }

 protected:
  QuantizeSpec spec(QuantizedRole role, bool columnwise) override;

 private:
  bool round_up_, swizzled_scales_;
};

// NVFP4 (§2.5): E2M1 with an E4M3 scale per 16 elements (16x16 tiles for weights) and an FP32
// tensor scale from the copy's amax; the 16-point RHT on the columnwise (wgrad) copies of inputs
// and gradients; stochastic rounding of gradients, one Philox stream per gradient copy.
class Nvfp4Quantizer final : public Quantizer {
 public:
  struct Options {
    bool hadamard = true, stochastic_rounding = true, weight_tiles = true;
    uint64_t seed = 0;
    bool swizzled_scales = false;
  };
  Nvfp4Quantizer(Backend& backend, const Options& options);
  DType format_dtype() const override { return DType::e2m1; }
  int64_t block_multiple() const override { return 16; }
  uint64_t rounding_streams() const override { return stochastic_streams_; }
  void set_rounding_streams(uint64_t streams) override { stochastic_streams_ = streams; }
  bool step_invariant() const override { return !options_.stochastic_rounding; }

 protected:
  QuantizeSpec spec(QuantizedRole role, bool columnwise) override;
  void copy_amax(const Tensor& x, const std::string& copy, bool transposed, QuantizedOperand& operand, Buffer& amax,
                 QuantizedTensor& q) override;

 private:
  Options options_;
  uint64_t stochastic_streams_ = 0;
};

}  // namespace mxtrain
