// The op interface every executor implements: cpu (FP32 oracle), cuda (fast kernels) and
// dryrun (shapes only). Model code calls these ops and nothing else, one op per line.
//
// Non-virtual interface: each public op validates its arguments, records its FLOPs and bytes
// (one formula for every backend, in backend.cpp) for an attached TraceObserver, then calls the
// backend's impl_ method. So the planner prices exactly the ops the real step runs.
//
// Conventions: activations are row-major [rows, cols] with rows = batch * seq (token-major).
// "accumulate" outputs are added to (+=); other outputs are overwritten. Ops run in order on the
// backend's stream; host-visible results need synchronize() or read_scalar().
// Interface version 7 (2: the quantization ops of the precision recipes; 3: the linear op with a
// fused residual add; 4: the linear ops with GELU fused on the forward and the input gradient;
// 7: one gemm(GemmArgs) for every linear GEMM, high precision or quantized, and its epilogues;
// 8: attention against a key/value cache for generation, and RoPE at a position offset).
#pragma once
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "mxtrain/backend/allocator.hpp"
#include "mxtrain/backend/buffer.hpp"
#include "mxtrain/backend/rope_spec.hpp"
#include "mxtrain/core/tensor.hpp"

namespace mxtrain {

#define MXTRAIN_OP_KINDS(X)                                                                              \
  X(fill) X(copy) X(copy_from_host) X(copy_to_host) X(embedding_forward) X(embedding_backward)            \
  X(norm_forward) X(add_norm_forward) X(norm_backward) X(linear_forward) X(linear_backward_input)        \
  X(linear_backward_weight) X(rope_forward) X(rope_backward) X(attention_forward) X(attention_backward)  \
  X(attention_cached)                                                                                    \
  X(swiglu_forward) X(swiglu_backward) X(gelu_forward) X(gelu_backward) X(add) X(cross_entropy)          \
  X(sum) X(sum_of_squares) X(scale) X(amax) X(quantize) X(dequantize) X(scale_update) X(column_sum)        \
  X(qkv_bias_gradient) X(adamw)

enum class OpKind : uint8_t {
#define MXTRAIN_ENUM_ENTRY(name) name,
  MXTRAIN_OP_KINDS(MXTRAIN_ENUM_ENTRY)
#undef MXTRAIN_ENUM_ENTRY
};
const char* op_kind_name(OpKind kind);
constexpr int kOpKindCount = static_cast<int>(OpKind::adamw) + 1;

// What part of the step an op belongs to; model code sets it through PhaseScope.
enum class Phase : uint8_t { forward, backward, recompute, optimizer, other };
const char* phase_name(Phase phase);

enum class NormKind : uint8_t { rms, layer };

// Column sums of a norm backward's dx, taken on the norm's own pass over dx: the bias gradients of
// the linears whose output gradient dx is. In a pre-norm block the residual gradient reaching the
// MLP norm's backward is the down projection's output gradient, and what leaves it is the
// attention output projection's, so both bias gradients ride on that one pass instead of two
// column-sum passes over the residual gradient. in (+)= the column sums of dx as it comes in
// (needs accumulate_dx), out (+)= those of dx as it leaves; each undefined when not wanted.
struct DxColumnSums {
  Tensor in{}, out{};
  bool accumulate_in = true, accumulate_out = true;
  bool any() const { return in.defined() || out.defined(); }
};

// Backend::head_loss's chunk: x [rows, hidden], weight [V, hidden], targets i32 [rows], losses f32
// [rows], logits [rows, V] (overwritten), columns >= valid_vocab padding; training: dx [rows,
// hidden] (overwritten), dweight [V, hidden] (+= with accumulate), grad_scale the gradient's scale.
struct HeadLossChunk {
  Tensor x{}, weight{}, targets{}, losses{}, logits{};
  int64_t valid_vocab = 0;
  float grad_scale = 0;
  Tensor dx{}, dweight{};
  bool accumulate = false;
};

struct OpRecord {
  OpKind kind;
  Phase phase;
  DType dtype;          // dtype of the main operand
  double flops = 0;     // floating-point operations (multiply-add = 2)
  double bytes = 0;     // minimal bytes read + written through device memory
  int64_t m = 0, n = 0, k = 0;  // GEMM shape (linear ops) or attention (batch*heads, seq, head_dim)
  // Of `bytes`, what a GEMM's epilogue moves besides its operands and output (the GELU
  // epilogues' second output or pre-activation input, the residual GEMM's C): traffic after
  // the math, not under it.
  double epilogue_bytes = 0;
  // quantize and dequantize: the format, named as supports() names it (e4m3 or e5m2 for
  // per-tensor FP8, e8m0 for MXFP8, e2m1 for NVFP4), so the planner can price each format's casts;
  // f32 for every other op.
  DType format = DType::f32;
};

struct AllocationEvent {
  std::string name;
  Lifetime lifetime;
  size_t bytes_requested;
  size_t bytes_rounded;
  bool is_free;
  size_t live_bytes_after;
};

// Receives every op and allocation a backend performs (the dryrun planner, tests, profiling).
class TraceObserver {
 public:
  virtual ~TraceObserver() = default;
  virtual void on_op(const OpRecord& record) = 0;
  virtual void on_allocation(const AllocationEvent& event) { (void)event; }
};

struct DeviceProperties {
  std::string name;               // "NVIDIA H200", "cpu (2 threads)", "dryrun h200"
  size_t memory_bytes = 0;        // capacity
  int compute_capability = 0;     // 90 for sm_90; 0 for cpu
  int multiprocessors = 0;        // or CPU threads
};

struct AttentionShape {
  int64_t batch = 0, seq = 0, heads = 0, kv_heads = 0, head_dim = 0;
  float softmax_scale = 0;  // 1/sqrt(head_dim) when 0
  // The position of row r is position_offset + r % seq (RoPE): 0 in training; in generation
  // with a key/value cache, the number of tokens already in the cache.
  int64_t position_offset = 0;
  int64_t qkv_cols() const { return (heads + 2 * kv_heads) * head_dim; }
};

// ---- quantized operands (the precision recipes; numerics/ holds the rules, bit for bit) -------

// How a quantized tensor is scaled (docs/numerics-reference.md §2).
enum class ScalingMode : uint8_t {
  per_tensor,  // FP8 E4M3/E5M2 with one FP32 scale per tensor (delayed or current scaling)
  mxfp8,       // FP8 with one E8M0 scale per 32 consecutive elements along K
  nvfp4,       // E2M1 with one E4M3 scale per 16 along K (or per 16x16 tile) and an FP32 tensor amax
};
const char* scaling_mode_name(ScalingMode mode);

// What one quantized copy of a tensor is. The copy is always a row-major [rows, K] matrix with K
// contiguous, the operand layout of a TN GEMM: the rowwise copy of x [R, C] is x itself, the
// columnwise copy is xᵀ [C, R] (the operand of the GEMMs that contract over R).
struct QuantizeSpec {
  ScalingMode mode = ScalingMode::per_tensor;
  DType element = DType::e4m3;       // e4m3 | e5m2 (per_tensor, mxfp8); e2m1 (nvfp4)
  bool mx_round_up = true;           // mxfp8 scales: NVIDIA RCEIL (TE, cuBLAS) or OCP floor
  bool nvfp4_tiles = false;          // nvfp4: one scale per 16x16 tile (weights) instead of per 1x16
  bool hadamard = false;             // nvfp4: the 16-point RHT along K first (wgrad operands)
  bool stochastic_rounding = false;  // nvfp4: E2M1 SR, word = Philox(seed, offset, row·K + k)
  uint64_t seed = 0, offset = 0;
  bool swizzled_scales = false;      // block scales in cuBLAS's 128x4 tiled layout (native GEMMs)
};

struct QuantizedTensor {
  QuantizeSpec spec;
  bool transposed = false;  // the columnwise copy: data holds xᵀ
  Tensor data;              // [rows, K]: e4m3/e5m2, or e2m1 (two per byte)
  // per_tensor: f32 [1], the decode scale (1/scale) the GEMM multiplies by; mxfp8: e8m0 and
  // nvfp4: e4m3 block scales, compact [rows, K/block] or swizzled (flat, padded).
  Tensor scale_inverse;
  Tensor amax;              // nvfp4: f32 [1], amax of the quantized matrix (S_dec = 6·448/amax)
  int64_t rows() const { return data.rows(); }
  int64_t k() const { return data.cols(); }
};

// Elements per block scale along K (1 for per_tensor) and the block scales' shape.
int64_t scaling_block_size(ScalingMode mode);
// The block-scale tensor of a [rows, k] copy: compact [rows, k/block] or swizzled flat.
Shape block_scale_shape(const QuantizeSpec& spec, int64_t rows, int64_t k);
DType block_scale_dtype(ScalingMode mode);

// Which of a linear layer's three GEMMs a GEMM is. The role fixes the operands' layout and the
// op kind the trace records (linear_forward, linear_backward_input, linear_backward_weight; a
// quantized GEMM is recorded as the linear op it replaces, so the planner prices it like the
// high-precision one, at the operands' tensor-core rate). Row-major, with high-precision
// operands:
//   forward          out[N,M] = a[N,K] · b[M,K]ᵀ    a = x,    b = weight
//   backward_input   out[N,K] = a[N,M] · b[M,K]     a = dout, b = weight
//   backward_weight  out[M,K] = a[N,M]ᵀ · b[N,K]    a = dout, b = x
// Quantized operands are always the TN copies (QuantizedTensor: [rows, K], K contiguous), so in
// every role out[R,C] = deq(a)[R,K] · deq(b)[C,K]ᵀ: forward a = x rowwise, b = W rowwise;
// backward_input a = dout rowwise, b = W columnwise; backward_weight a = dout columnwise,
// b = x columnwise. Per-tensor FP8 accumulates fast in the forward role, split in the backward
// roles on Hopper (TransformerEngine's defaults).
enum class GemmRole : uint8_t { forward, backward_input, backward_weight };

// One GEMM operand: a high-precision matrix (f32/bf16/f16) or a quantized copy, which carries
// its data, its decode scale(s) and its format (QuantizedTensor::spec). Both operands of a GEMM
// are of the same kind.
struct GemmOperand {
  Tensor tensor{};              // high precision
  QuantizedTensor quantized{};  // quantized: defined data
  GemmOperand() = default;
  GemmOperand(const Tensor& value) : tensor(value) {}            // NOLINT: an operand is its matrix
  GemmOperand(const Buffer& value) : tensor(value.tensor()) {}   // NOLINT
  GemmOperand(const QuantizedTensor& value) : quantized(value) {}  // NOLINT
  bool is_quantized() const { return quantized.data.defined(); }
};

// What happens to the product before it is stored (cuBLASLt's epilogues). With them, the optional
// tensors of GemmArgs:
//   bias           forward: + bias[M] (the BIAS epilogue; with gelu_aux_bias, before the GELU)
//   residual       forward: + residual[N,M] (C = residual, beta = 1: one rounding)
//   bias_gradient  backward_weight: (+)= the column sums of the output gradient a (BGRADB);
//                  backward_input with dgelu: (+)= the column sums of out, the gradient of the
//                  pre-activation, i.e. the bias gradient of the linear that made it (where
//                  gemm_fuses_dgelu_bias_gradient says so, inside the GEMM: quack's DGELU GEMM on an
//                  H100/H200; else a column sum after it)
//   accumulate     out (+)= (C = out, beta = 1); applies to a backward_weight's bias_gradient too
//   bias_gradient_accumulate  dgelu's bias_gradient (+)= (out itself is overwritten)
enum class GemmEpilogue : uint8_t {
  none,
  // forward: aux = product (+ bias), out = gelu(aux) (GELU_AUX_BIAS: the GELU of the f32 sum,
  // before its 16-bit rounding where the backend fuses it; else the GEMM writes aux and
  // gelu_forward runs on the rounded aux). aux and out have one shape and dtype; overwritten.
  gelu_aux_bias,
  // forward: aux = product [N, 2F] (gate/up interleaved: swiglu_forward), out [N, F] =
  // silu(gate) · up. Where the backend fuses it (gemm_fuses_swiglu: quack's gated GEMM on an
  // H200) SwiGLU is applied to the f32 product before its 16-bit rounding; else the GEMM writes
  // aux and swiglu_forward runs on the rounded aux. No bias. aux and out are overwritten.
  swiglu_aux,
  // backward_input: out = product ⊙ gelu'(aux), aux the forward's pre-activation (DGELU: on the
  // f32 product where the backend fuses it; else the product is rounded to out's dtype in a
  // scratch "linear.gelu_input_grad" first). Overwritten.
  dgelu,
};
const char* gemm_epilogue_name(GemmEpilogue epilogue);

// The one GEMM of the Backend (Backend::gemm). Quantized operands take no epilogue but the bias
// and a forward's residual: the recipes run the rest as separate ops.
struct GemmArgs {
  // (Every member has an initializer, so designated initializers may leave any of them out.)
  GemmRole role = GemmRole::forward;
  GemmOperand a{}, b{};
  Tensor out{};
  bool accumulate = false;
  GemmEpilogue epilogue = GemmEpilogue::none;
  Tensor bias{};           // input, [M]
  Tensor residual{};       // input, out's shape and dtype
  Tensor bias_gradient{};  // output, [M] (backward_weight), [K] (backward_input with dgelu)
  bool bias_gradient_accumulate = false;  // dgelu's bias_gradient only
  Tensor aux{};            // gelu_aux_bias, swiglu_aux: output; dgelu: input
};

struct ScaleUpdateArgs {
  enum class Rule : uint8_t {
    delayed,  // §2.1: scale from the history window, then the history rolls
    current,  // §2.2: scale from this amax (history of length 1, not rolled)
  };
  Rule rule = Rule::delayed;
  float scaled_max = 448.0f;      // fp8_max(format) · 2^-margin (delayed); fp8_max(format) (current)
  bool most_recent = false;       // delayed: slot 0 instead of the max over the window
  float epsilon = 0.0f;           // current: amax floor
  bool power_of_2_scales = false; // current: round scales down to powers of two
};

// Current scaling inside the cast (quantize): the cast first sets scale[0] from amax[0] by the
// current rule of args (what fp8_scale_update(amax, scale, ..., args) would write), then casts
// with it — one op instead of a scale update and a cast, as TransformerEngine's current-scaling
// quantizer computes its scale in the cast kernel.
struct ScaleFromAmax {
  Tensor amax;           // f32 [1]: the amax of the tensor being cast
  ScaleUpdateArgs args;  // rule current
  bool defined() const { return amax.defined(); }
};

// The op that writes a cast's input, fused into the cast (quantize's producer): the cast
// computes x from the op's inputs instead of reading it, so x is never written (its Tensor gives
// only shape and dtype; data may be null). Each value is the op's output rounded to x's dtype,
// as the op's own kernel rounds it, so the codes and the recorded amax are those of the op
// followed by the cast, bit for bit. Per-tensor FP8 with a known scale only (delayed scaling):
// current scaling needs the amax before the pass, and the block formats cast from x itself.
struct CastProducer {
  enum class Op : uint8_t {
    none,
    swiglu_forward,   // x [R, F] = swiglu_forward(gate_up [R, 2F])
    swiglu_backward,  // x [R, 2F] = swiglu_backward(dout [R, F], gate_up [R, 2F]), both interleaved
    norm_forward,     // x [R, H] = norm_forward(input [R, H]) with the statistics its stats-only
                      // pass saved (norm_forward or add_norm_forward without an output)
    rope_backward,    // x [R, qkv] = rope_backward(input [R, qkv]) (shape, rope), input unchanged
  };
  Op op = Op::none;
  Tensor gate_up{}, dout{};
  // swiglu_backward only, optional: from the same reads of gate_up, also the activation
  // swiglu_forward(gate_up) [R, F] cast to its own per-tensor E4M3 columnwise copy with its own
  // scale, its decode scale 1 / scale[0] and its amax recorded (max=) — what quantize(act,
  // act_scale, {}, act_columnwise, act_amax) would make. The down projection's weight gradient
  // reads that copy, so gate_up is read once in the MLP's backward instead of twice.
  Tensor act_scale{}, act_amax{};
  QuantizedTensor act_columnwise{};
  // norm_forward: the norm's input, weight, bias (layer), and its saved mean (layer) and rstd.
  NormKind norm = NormKind::rms;
  Tensor input{}, weight{}, bias{}, mean{}, rstd{};
  float eps = 0;  // the norm's (the CPU recomputes the statistics; they come out the same)
  // rope_backward: input is the gradient before the inverse rotation.
  AttentionShape shape{};
  RopeSpec rope{};
  bool defined() const { return op != Op::none; }
};

// A weight inside an optimizer shard, elements [begin, end), whose amax the optimizer step
// records as it writes the new values (current scaling's weight amax: the cast that follows the
// step then skips its own pass over the weight).
struct AmaxSegment {
  int64_t begin = 0, end = 0;
  Tensor amax;  // f32 [1]: max= the amax of the new compute copy (the master without one) there
};

// A weight inside an optimizer shard, elements [begin, end), that the optimizer step also casts
// to its per-tensor FP8 rowwise copy as it writes the new values (delayed scaling: the next
// forward's copy, which that forward then takes instead of casting the weight). Exactly what
// quantize(weight, scale, out, {}, amax) would do on the new compute copy (the master without
// one) viewed as out's [rows, k]: out.data = fp8(value · scale[0]), out.scale_inverse[0] =
// 1 / scale[0], amax max= the amax of the new values.
struct WeightCastSegment {
  int64_t begin = 0, end = 0;
  Tensor scale;         // f32 [1]
  QuantizedTensor out;  // per-tensor E4M3, rowwise, end - begin elements
  Tensor amax;          // f32 [1]
};

struct AdamWArgs {
  float learning_rate = 0;
  float beta1 = 0.9f, beta2 = 0.95f, epsilon = 1e-8f;
  float weight_decay = 0;
  int64_t step = 1;            // 1-based, for bias correction
  int64_t decay_count = 0;     // elements [0, decay_count) get weight decay, the rest not
  float grad_multiplier = 1;   // e.g. 1/loss_scale; applied before clipping
  float max_grad_norm = 0;     // 0 = no clipping
  std::vector<AmaxSegment> weight_amaxes;  // recorded on the way where the backend can
  std::vector<WeightCastSegment> weight_casts;  // cast on the way where the backend can
  // Optional f32 [3] on the device holding adamw_step_factors() of this step, read in place of
  // the ones formed from learning_rate and step: a step captured in a graph (begin_capture)
  // replays with the factors its session copies there from the host before each replay.
  Tensor step_factors;
  // Whether the update also sums the squares of the gradients it reads, (grad · grad_multiplier)²
  // over its elements, into grad_norm_sq[0] (overwrite: = the sum; add: += the sum): the norm a
  // run reports when nothing is clipped (max_grad_norm = 0, required), without a pass of its own
  // over the gradients. Deterministic like sum_of_squares, not bit-equal to it (another order).
  enum class NormOutput { none, overwrite, add };
  NormOutput grad_norm_output = NormOutput::none;
  // A split master (numerics/split_master.hpp): u8 [2 * count], the low halves as 16-bit words.
  // The master is then compute_copy (bf16, the high halves) joined with these; `param` is
  // undefined, and the update writes both halves back.
  Tensor master_low;
};

// The learning-rate and step dependent factors of an AdamW update, formed in double and rounded
// to f32 as torch does: weight decay's 1 - lr * wd, -lr / (1 - beta1^step), sqrt(1 - beta2^step).
struct AdamWStepFactors {
  float decay_factor, negative_step_size, bias_correction2_sqrt;
};
AdamWStepFactors adamw_step_factors(const AdamWArgs& args);

// The elements between the starts of consecutive rows of a column sum's input: its columns when
// contiguous, else the row stride of a 2-D view whose rows are column ranges of wider rows (the
// query part of the packed q|k|v gradient); asserts the input is one or the other.
int64_t column_sum_row_stride(const Tensor& x);

class Backend {
 public:
  virtual ~Backend();

  virtual std::string_view name() const = 0;
  virtual Device device() const = 0;
  virtual DeviceProperties properties() const = 0;
  // Whether this backend runs `kind` with activations of `dtype`. Asked before step 1; a
  // missing op is an error naming the op and dtype, never a silent fallback.
  virtual bool supports(OpKind kind, DType dtype) const = 0;
  // Whether the forward GEMM x [N, k] · Wᵀ with the swiglu_aux epilogue (2·ffn output columns)
  // runs as one fused kernel here with activations of `dtype`. The model asks it in place of
  // running the GEMM and swiglu_forward, so a backend that would only run the two apart says no
  // (and the dry run, which prices the op trace, answers as the GPU it models would).
  virtual bool gemm_fuses_swiglu(DType dtype, int64_t k, int64_t ffn) const {
    (void)dtype, (void)k, (void)ffn;
    return false;
  }
  // Whether a backward_input GEMM with the dgelu epilogue (dout [N, k], dx [N, n] of `dtype`)
  // sums its bias_gradient inside the GEMM here: the model hands the bias gradient of the
  // linear before the GELU to that GEMM only where it says yes, else to that linear's
  // backward_weight (a backend that would only run the column sum after it says no).
  virtual bool gemm_fuses_dgelu_bias_gradient(DType dtype, int64_t k, int64_t n) const {
    (void)dtype, (void)k, (void)n;
    return false;
  }
  // Whether head_loss runs chunk `c` (training: dx defined) as one fused pipeline here: quack's
  // scaled-exp linear cross-entropy on an H100/H200 (train.head_loss; the dry run answers as the GPU
  // it models would).
  virtual bool fuses_head_loss(const HeadLossChunk& c) const {
    (void)c;
    return false;
  }
  // Error(config or unsupported), with the fix, when the attention backward as this backend is
  // set (train.attention_backward, train.deterministic) cannot run `shape` with `activations`.
  // Asked before step 1, like supports().
  virtual void check_attention_backward(const AttentionShape& shape, DType activations) const {
    (void)shape;
    (void)activations;
  }
  // Whether the norm and activation kernels record their output's amax themselves (out_amax).
  virtual bool records_output_amax() const { return false; }
  // Whether adamw's kernel writes args.weight_casts itself (else a quantize pass each after it).
  virtual bool casts_weights_in_adamw() const { return false; }
  virtual void synchronize() = 0;
  // Timing in stream order: record_timestamp() marks the point after all work queued so far;
  // elapsed_ms(a, b) waits for b and returns the time between the marks. Default: host clock
  // (exact for synchronous backends); cuda overrides it with CUDA events.
  virtual uint64_t record_timestamp();
  virtual double elapsed_ms(uint64_t start, uint64_t end);

  // ---- step graphs ------------------------------------------------------------------------
  // The ops issued between begin_capture() and end_capture() are recorded, not run, and
  // replay() runs them again as recorded: same buffers, same arguments. Only copy_from_host is
  // live: a recorded copy re-reads its host bytes at every replay, so the caller keeps them at
  // the same address and writes each replay's values there first. A caller captures only work
  // that neither reads results on the host nor depends on host state that changes between
  // replays (AdamWArgs::step_factors carries the learning rate). Backends that cannot capture
  // return false from begin_capture() and the caller runs its ops as usual; cuda captures into
  // a CUDA graph.
  virtual bool begin_capture() { return false; }
  // True if the recording holds; false (logged) if the device refused it: nothing ran and
  // there is nothing to replay.
  virtual bool end_capture() { return false; }
  // Runs the recording; false, and nothing runs, when there is none or it is stale (memory was
  // allocated since the capture, so buffers the recording uses may belong to someone else).
  virtual bool replay() { return false; }
  virtual void drop_capture() {}

  // ---- memory -----------------------------------------------------------------------------
  // at: where the buffer should start if that memory is free (CachingAllocator::allocate).
  Buffer allocate(const std::string& name, Shape shape, DType dtype, Lifetime lifetime, const void* at = nullptr);
  MemoryStats memory_stats() const { return allocator_->stats(); }
  void reset_peak_memory() { allocator_->reset_peak(); }
  CachingAllocator& allocator() { return *allocator_; }

  void set_observer(TraceObserver* observer) { observer_ = observer; }
  TraceObserver* observer() const { return observer_; }
  void set_phase(Phase phase) { phase_ = phase; }
  Phase phase() const { return phase_; }

  // ---- data movement ----------------------------------------------------------------------
  void fill(const Tensor& out, float value);
  void copy(const Tensor& source, const Tensor& out);  // same shape; converts between f32/bf16/f16
  void copy_from_host(const void* host, const Tensor& out);  // host bytes in out's dtype
  void copy_to_host(const Tensor& source, void* host);        // synchronous
  float read_scalar(const Tensor& source);                    // element 0 of an f32 tensor; synchronous

  // ---- model ops --------------------------------------------------------------------------
  // out[i] = token_table[tokens[i]] (+ position_table[i % seq_len] when defined).
  void embedding_forward(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                         const Tensor& out, int64_t seq_len);
  // dtoken_table[tokens[i]] += dout[i]; dposition_table[i % seq_len] += dout[i] (when defined).
  void embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                          const Tensor& dposition_table, int64_t seq_len);
  // Output amax (norms, SwiGLU, GELU): when out_amax (f32 [1]) is defined it is set to the amax of
  // the op's output — of dx after the accumulation for norm_backward — as Backend::amax would
  // compute it; the current-scaling FP8 recipe casts that output next. Backends whose kernels
  // record it on the way (records_output_amax()) spare that pass; for the others the op runs the
  // amax pass itself after its own work. Either way it is part of the op, not an amax op of the
  // trace.
  //
  // out = norm(x) * weight (+ bias). RMS: rstd = 1/sqrt(mean(x^2) + eps), mean undefined.
  // Layer: mean, rstd of x. mean and rstd are f32 [rows]. out may be undefined: the statistics
  // alone, for a cast that computes the output itself (CastProducer::Op::norm_forward).
  void norm_forward(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& out,
                    const Tensor& mean, const Tensor& rstd, float eps, const Tensor& out_amax = {});
  // sum = a + b, then out = norm(sum): the residual add fused with the next norm (out may be
  // undefined, as for norm_forward: the sum and the statistics).
  void add_norm_forward(NormKind kind, const Tensor& a, const Tensor& b, const Tensor& sum, const Tensor& weight,
                        const Tensor& bias, const Tensor& out, const Tensor& mean, const Tensor& rstd, float eps,
                        const Tensor& out_amax = {});
  // dx (+)= d norm; dweight (+)= ; dbias (+)= (layer). mean/rstd as saved by the forward.
  // accumulate_dparams = false overwrites dweight and dbias (a gradient's first write).
  // dx_sums: column sums of dx before and after (DxColumnSums), part of the op.
  void norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                     const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                     bool accumulate_dx, bool accumulate_dparams = true, const Tensor& dx_amax = {},
                     const DxColumnSums& dx_sums = {});
  // The GEMMs of the linear layers, high precision or quantized, with their epilogues
  // (GemmArgs above). supports(linear_forward, e4m3 | e8m0 | e2m1) says whether a quantized GEMM
  // of that format exists; the precision recipes emulate it otherwise.
  void gemm(const GemmArgs& args);
  // Rotary embedding in place on the q and k parts of qkv [batch*seq, (heads+2*kv_heads)*head_dim],
  // rotate-half convention (pairs i and i+head_dim/2), position = row % seq.
  void rope_forward(const Tensor& qkv, const AttentionShape& shape, const RopeSpec& rope);
  // The inverse rotation; out_amax (as the norms'): the amax of all of dqkv after it, v included.
  void rope_backward(const Tensor& dqkv, const AttentionShape& shape, const RopeSpec& rope, const Tensor& out_amax = {});
  // Causal grouped-query attention. qkv packed as above; out [batch*seq, heads*head_dim];
  // lse f32 [batch, heads, seq] = log-sum-exp of each softmax row (kept for backward).
  void attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse, const AttentionShape& shape);
  // Generation with a key/value cache (batch 1, forward only): qkv [seq, qkv_cols] holds the
  // new tokens at positions [past, past + seq), past = shape.position_offset, after RoPE.
  // k_cache and v_cache [capacity, kv_heads*head_dim] (qkv's dtype) hold the keys and values of
  // positions [0, past); the op first stores the new rows' keys and values at rows
  // [past, past + seq), then out[i] = softmax(scale · q_i · K[0, past+i]ᵀ) · V[0, past+i]: the
  // rows of attention_forward over the whole sequence that belong to the new tokens.
  void attention_cached(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache, const Tensor& out,
                        const AttentionShape& shape);
  // dqkv (overwritten) from dout, the forward's qkv, out and lse.
  void attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                          const Tensor& dqkv, const AttentionShape& shape);
  // out[N,F] = silu(gate) * up with gate_up [N, 2F] interleaved: gate j in column 2j, up j in
  // column 2j + 1 (the llama MLP stores its gate/up weight rows in that order: model/layout.hpp).
  // dgate_up [N, 2F] in the same order.
  void swiglu_forward(const Tensor& gate_up, const Tensor& out, const Tensor& out_amax = {});
  void swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up, const Tensor& out_amax = {});
  // GELU, tanh approximation.
  void gelu_forward(const Tensor& x, const Tensor& out, const Tensor& out_amax = {});
  void gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, const Tensor& out_amax = {});
  void add(const Tensor& a, const Tensor& b, const Tensor& out);
  // Softmax cross-entropy of logits [n, V] against targets i32 [n]; columns >= valid_vocab are
  // padding and ignored. losses f32 [n] get -log p(target). When grad_scale != 0 the logits are
  // overwritten in place by grad_scale * (softmax - onehot) (zero in padding columns).
  void cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses, int64_t valid_vocab,
                     float grad_scale);
  // One chunk of the LM head and its loss (Transformer::head): logits = x · weightᵀ, the
  // cross-entropy into losses (as cross_entropy), and when training (dx defined) dx = dlogits ·
  // weight and dweight (+)= dlogitsᵀ · x with dlogits = grad_scale · (softmax - onehot). Runs as the
  // forward gemm, cross_entropy in place on logits and the two gradient gemms, or where the backend
  // fuses it (fuses_head_loss) as one pipeline that uses logits as its scratch; it records the same
  // three GEMMs either way, and the fused pipeline's glue as a cross_entropy op.
  void head_loss(const HeadLossChunk& c);
  // out f32[1] (+)= sum(x) or sum(x^2) for x of any float dtype.
  void sum(const Tensor& x, const Tensor& out, bool accumulate);
  void sum_of_squares(const Tensor& x, const Tensor& out, bool accumulate);
  void scale(const Tensor& x, float factor);  // in place

  // ---- precision recipes ----------------------------------------------------------------------
  // supports() for these: quantize, dequantize, amax with dtype e4m3/e5m2 (per-tensor FP8),
  // e8m0 (MXFP8) or e2m1 (NVFP4). A quantized GEMM is asked as linear_forward with e4m3
  // (per-tensor FP8 GEMM), e8m0 (MXFP8 block-scaled GEMM) or e2m1 (NVFP4 GEMM); a backend without
  // it runs the recipe emulated (dequantize, then the high-precision linear op).
  //
  // out f32[1] = (accumulate ? max(out, a) : a), a = max |value| over x [R, C] (NaN if any value
  // is NaN), or over xᵀ after the 16-point RHT along its rows when hadamard_transposed (the
  // columnwise NVFP4 copy of a wgrad operand).
  void amax(const Tensor& x, const Tensor& out, bool accumulate, bool hadamard_transposed = false);
  // Quantizes x [R, C] (f32/bf16/f16) into its rowwise copy (x) and/or columnwise copy (xᵀ);
  // an undefined copy's data is skipped. per_tensor: codes = fp8(x · scale[0]), scale f32 [1],
  // and each copy's own scale_inverse[0] = 1 / scale[0] (a 16-byte-aligned buffer of its own:
  // cuBLAS 13 rejects FP8 scale pointers inside arrays); amax (optional, f32 [1]) max= max |x|
  // (delayed scaling records it during the cast). from (per_tensor, optional): scale is an output,
  // set from from.amax first (ScaleFromAmax).
  // mxfp8: block scales computed here. nvfp4: each copy's amax must already hold its matrix's
  // amax (the amax op). Both copies use one read of x where the backend can.
  // producer (optional; per-tensor FP8 without from): x is computed in the cast (CastProducer).
  void quantize(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise, const QuantizedTensor& columnwise,
                const Tensor& amax, const ScaleFromAmax& from = {}, const CastProducer& producer = {});
  // out (f32/bf16/f16) = the values q encodes, in x's layout [R, C] (a columnwise copy is
  // transposed back; an RHT copy stays in the Hadamard domain).
  void dequantize(const QuantizedTensor& q, const Tensor& out);
  // FP8 scales of n tensors from their amaxes: history f32 [length, n] (slot 0 newest), scale
  // and scale_inverse f32 [n]. delayed: new scale from the window (previous one kept when the
  // window max is 0, inf or NaN), then slot k → k+1 and slot 0 = 0. current: from slot 0 of a
  // length-1 history, which is left as it is.
  void fp8_scale_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inverse,
                        const ScaleUpdateArgs& args);
  // out[c] (+)= Σ_r x[r, c] (bias gradients next to a quantized weight-gradient GEMM). x is
  // contiguous, or a 2-D view of a column range of whole rows (column_sum_row_stride).
  void column_sum(const Tensor& x, const Tensor& out, bool accumulate = true);
  // GPT-2's QKV bias gradient from what softmax attention is (transformer.cpp says why), for as
  // many key/value heads as query heads, without RoPE: dqkv [rows, 3C] the packed q|k|v
  // gradient, out_bias_grad [C] the attention output projection's bias gradient summed so far
  // this step, out_weight [C, C] its weight (any float dtype), qkv_bias_grad [3C] (the out bias
  // gradient's dtype). The queries' part (+)= the column sums of dq; the keys' part = 0 (left as it is
  // when accumulating: zero plus zero); the values' part = out_bias_grad · out_weight,
  // overwritten (the out bias gradient is the running sum). Two launches on the GPU, as a
  // column sum: dq's partial sums, then one kernel for the three parts.
  void qkv_bias_gradient(const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                         const Tensor& qkv_bias_grad, bool accumulate);
  // Decoupled-weight-decay Adam on a flat f32 master tensor. grad (any float dtype) is
  // multiplied by args.grad_multiplier and, when args.max_grad_norm > 0, by
  // min(1, max_grad_norm / (sqrt(grad_norm_sq[0]) + 1e-6)). compute_copy (optional, bf16/f16)
  // receives the rounded new weights. args.weight_amaxes: each segment's amax max= the amax of
  // the new weights there, as the amax op would take it over that slice of compute_copy (param
  // without one) — recorded by the kernel where records_output_amax(), else a pass after it.
  // args.weight_casts: each segment's new values cast to its FP8 copy (WeightCastSegment) — by
  // the kernel where casts_weights_in_adamw(), else a quantize pass after it.
  // With args.master_low the master is split (param undefined; compute_copy bf16 holds the
  // high halves): joined, updated as above, split again (numerics/split_master.hpp).
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& compute_copy,
             const Tensor& grad_norm_sq, const AdamWArgs& args);

 protected:
  explicit Backend(std::unique_ptr<MemorySource> source);
  void record(const OpRecord& record);

  virtual void impl_fill(const Tensor& out, float value) = 0;
  virtual void impl_copy(const Tensor& source, const Tensor& out) = 0;
  virtual void impl_copy_from_host(const void* host, const Tensor& out) = 0;
  virtual void impl_copy_to_host(const Tensor& source, void* host) = 0;
  virtual void impl_embedding_forward(const Tensor& tokens, const Tensor& token_table, const Tensor& position_table,
                                      const Tensor& out, int64_t seq_len) = 0;
  virtual void impl_embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken_table,
                                       const Tensor& dposition_table, int64_t seq_len) = 0;
  // out_amax / dx_amax: defined only where records_output_amax() (the op's kernel records it).
  virtual void impl_norm_forward(NormKind kind, const Tensor& x, const Tensor& weight, const Tensor& bias,
                                 const Tensor& out, const Tensor& mean, const Tensor& rstd, float eps,
                                 const Tensor& out_amax) = 0;
  // Default: add, then norm_forward. Backends with a fused kernel override it.
  virtual void impl_add_norm_forward(NormKind kind, const Tensor& a, const Tensor& b, const Tensor& sum,
                                     const Tensor& weight, const Tensor& bias, const Tensor& out, const Tensor& mean,
                                     const Tensor& rstd, float eps, const Tensor& out_amax);
  virtual void impl_norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                                  const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dweight,
                                  const Tensor& dbias, bool accumulate_dx, bool accumulate_dparams,
                                  const Tensor& dx_amax, const DxColumnSums& dx_sums) = 0;
  // The GEMM, arguments checked. Backends without a fused epilogue (or without one for this
  // call) run gemm_epilogue_apart.
  virtual void impl_gemm(const GemmArgs& args) = 0;
  // A high-precision GEMM whose residual, gelu_aux_bias, swiglu_aux or dgelu epilogue runs as ops
  // of their own: impl_gemm without it, then impl_add, impl_gelu_forward, impl_swiglu_forward or
  // (through a scratch) impl_gelu_backward. args must have one of those epilogues.
  void gemm_epilogue_apart(const GemmArgs& args);
  // Whether args asks for an epilogue that gemm_epilogue_apart can run apart.
  static bool has_separable_epilogue(const GemmArgs& args) {
    return args.residual.defined() || args.epilogue != GemmEpilogue::none;
  }
  virtual void impl_rope(const Tensor& qkv, const AttentionShape& shape, const RopeSpec& rope, bool inverse,
                         const Tensor& out_amax) = 0;
  virtual void impl_attention_cached(const Tensor& qkv, const Tensor& k_cache, const Tensor& v_cache,
                                     const Tensor& out, const AttentionShape& shape) = 0;
  virtual void impl_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                      const AttentionShape& shape) = 0;
  virtual void impl_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                                       const Tensor& dqkv, const AttentionShape& shape) = 0;
  virtual void impl_swiglu_forward(const Tensor& gate_up, const Tensor& out, const Tensor& out_amax) = 0;
  virtual void impl_swiglu_backward(const Tensor& dout, const Tensor& gate_up, const Tensor& dgate_up,
                                    const Tensor& out_amax) = 0;
  virtual void impl_gelu_forward(const Tensor& x, const Tensor& out, const Tensor& out_amax) = 0;
  virtual void impl_gelu_backward(const Tensor& dout, const Tensor& x, const Tensor& dx, const Tensor& out_amax) = 0;
  virtual void impl_add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // Only where fuses_head_loss(c) said yes.
  virtual void impl_head_loss_fused(const HeadLossChunk& c);
  virtual void impl_cross_entropy(const Tensor& logits, const Tensor& targets, const Tensor& losses,
                                  int64_t valid_vocab, float grad_scale) = 0;
  virtual void impl_sum(const Tensor& x, const Tensor& out, bool accumulate, bool squares) = 0;
  virtual void impl_scale(const Tensor& x, float factor) = 0;
  virtual void impl_amax(const Tensor& x, const Tensor& out, bool accumulate, bool hadamard_transposed) = 0;
  virtual void impl_quantize(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                             const QuantizedTensor& columnwise, const Tensor& amax, const ScaleFromAmax& from) = 0;
  // quantize with a producer: the CUDA backend runs one fused kernel; the CPU backend runs the
  // op into a temporary and casts it (the same values by construction).
  virtual void impl_quantize_produced(const Tensor& x, const Tensor& scale, const QuantizedTensor& rowwise,
                                      const QuantizedTensor& columnwise, const Tensor& amax,
                                      const CastProducer& producer) = 0;
  virtual void impl_dequantize(const QuantizedTensor& q, const Tensor& out) = 0;
  virtual void impl_fp8_scale_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inverse,
                                     const ScaleUpdateArgs& args) = 0;
  virtual void impl_column_sum(const Tensor& x, const Tensor& out, bool accumulate) = 0;
  virtual void impl_qkv_bias_gradient(const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                                      const Tensor& qkv_bias_grad, bool accumulate) = 0;
  virtual void impl_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                          const Tensor& compute_copy, const Tensor& grad_norm_sq, const AdamWArgs& args) = 0;

 private:
  // An op's out_amax: what its impl_ gets (the record itself where the kernels write it), and
  // after the impl_ call, the amax pass (impl_amax) where they do not.
  Tensor kernel_amax(const Tensor& out_amax) const;
  void finish_amax(const Tensor& out, const Tensor& out_amax);
  // Backend::gemm's checks and trace record, by operand kind.
  void check_and_record_gemm(const GemmArgs& args);
  void check_and_record_quantized_gemm(const GemmArgs& args);
  std::unique_ptr<CachingAllocator> allocator_;
  TraceObserver* observer_ = nullptr;
  Phase phase_ = Phase::other;
};

// Sets the backend's phase for a scope and restores the previous one.
class PhaseScope {
 public:
  PhaseScope(Backend& backend, Phase phase) : backend_(backend), previous_(backend.phase()) {
    backend.set_phase(phase);
  }
  ~PhaseScope() { backend_.set_phase(previous_); }

 private:
  Backend& backend_;
  Phase previous_;
};

// ---- registry (registry.cpp): one explicit list; cuda only when built with CUDA -------------
struct BackendOptions {
  int threads = 0;             // cpu: 0 = all cores
  int device_index = 0;        // cuda
  bool deterministic = false;  // cuda: deterministic attention backward
  bool flash_attention_4_backward = false;  // cuda: FlashAttention-4's attention backward (train.attention_backward)
  bool tf32 = false;           // cuda: TF32 tensor cores for f32 GEMMs
  bool gemm_autotune = false;  // cuda: time cuBLASLt's candidate algorithms per GEMM shape
  bool gemm_quack = false;     // cuda: with gemm_autotune, quack's GEMMs among the candidates (train.gemm_kernels)
  bool gemm_quack_swiglu = false;  // cuda: llama's gate/up GEMM with SwiGLU fused, quack's (train.gemm_kernels)
  bool gemm_quack_gelu = false;    // cuda: GPT-2's GELU forward and DGELU backward GEMMs, quack's (train.gemm_kernels)
  bool head_loss_quack = false;  // cuda: the LM head's loss as quack's linear cross-entropy (train.head_loss)
  size_t memory_bytes = 0;     // dryrun: simulated capacity
  std::string device_label;    // dryrun: e.g. "h200"
};
std::vector<std::string> backend_names();  // in registration order
bool backend_available(std::string_view name);
// The kernels compiled ahead of time that this build links (-DMXTRAIN_FLASH_ATTENTION_4:
// docs/attention.md, docs/gemm-kernels.md): FlashAttention-4's backward configurations as
// "d<head_dim>_g<query heads per key/value head>", and whether quack's gated (SwiGLU) GEMM, its
// GELU GEMMs and its linear cross-entropy are among quack's GEMMs. Empty without them or without CUDA.
struct CarriedKernels {
  std::vector<std::string> flash_attention_4;
  bool quack_gated_gemm = false;
  bool quack_gelu_gemms = false;  // GPT-2's GELU forward and DGELU backward GEMMs
  bool quack_linear_cross_entropy = false;
};
CarriedKernels carried_kernels();
// The compute capability (e.g. 90) of CUDA device `index`; 0 where there is none or no CUDA.
int cuda_compute_capability(int index = 0);
std::unique_ptr<Backend> create_backend(std::string_view name, const BackendOptions& options = {});

}  // namespace mxtrain
