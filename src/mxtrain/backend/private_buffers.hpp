// What the cuda backend allocates inside its ops, besides the buffers the model hands it: library
// workspaces and kernel scratch. One description, as pure functions of an op's arguments and of
// device facts, called by both
//   - backend/cuda, which allocates exactly the list a function returns (allocate_private), in
//     order, and holds it for the op (scratch) or for the backend's life (workspace), and
//   - backend/dryrun (CudaAllocationModel enabled), which records exactly the same list through
//     the same caching allocator, so the planner's peak and reserved bytes are the cuda run's.
//
// Device facts: values only the device knows at run time are arguments, never modelled here.
//   cuDNN's SDPA workspace   the bytes the built plan asks for (get_workspace_size)
//   cub's radix-sort storage the temp bytes cub's size query returns for the embedding backward
// The cuda backend passes the real value; the dryrun passes its model's (plan/calibration,
// CudaAllocationModel) or, where a test recorded a cuda run's values, those (DeviceFacts).
//
// Nothing here includes CUDA: the library (and so the dryrun and the CPU tests) compiles it.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mxtrain/backend/backend.hpp"

namespace mxtrain::private_buffers {

// One allocation: Backend::allocate(name, shape, dtype, lifetime).
struct PrivateBuffer {
  std::string name;
  Shape shape;
  DType dtype = DType::u8;
  Lifetime lifetime = Lifetime::scratch;
  size_t bytes() const { return dtype_bytes(dtype, static_cast<size_t>(shape.numel())); }
  bool operator==(const PrivateBuffer& other) const {
    return name == other.name && shape == other.shape && dtype == other.dtype && lifetime == other.lifetime;
  }
};
using PrivateBuffers = std::vector<PrivateBuffer>;

// Allocates the list in order; the Buffers keep it alive (move them into the op's scope).
std::vector<Buffer> allocate_private(Backend& backend, const PrivateBuffers& buffers);
Buffer allocate_private(Backend& backend, const PrivateBuffer& buffer);

// ---- at creation -------------------------------------------------------------------------------
// cuBLASLt's workspace (every GEMM may use up to this much) and the whole-tensor sum's partials
// (one f32 per block of the first stage; the second stage is one block of that many threads).
constexpr size_t kGemmWorkspaceBytes = size_t{32} << 20;
constexpr int kReductionBlocks = 1024;
// "cublaslt.workspace" u8, then "reduction.partials" f32 [kReductionBlocks]; Lifetime::workspace.
PrivateBuffers backend_workspaces();

// ---- reductions -------------------------------------------------------------------------------
// Row chunks of the two-stage column reductions (column_sum, the unfused norm backward): at
// least 32 rows a chunk, at most 512 chunks, at least 1.
int64_t column_reduction_chunks(int64_t rows);
// column_sum(x): "column_sum.partials" f32 [chunks, cols]; nothing for an empty x.
PrivateBuffers column_sum(const Tensor& x);
// qkv_bias_gradient(dqkv [rows, 3·hidden], hidden): the column sum's partials of dq, its first
// hidden columns.
PrivateBuffers qkv_bias_gradient(const Tensor& dqkv, int64_t hidden);

// ---- norm backward ----------------------------------------------------------------------------
// The fused kernel (dx and per-chunk dweight/dbias sums in one pass, 4 warps a block) runs where
// the row fits its lanes and its warps' sums fit 96 KiB of shared memory; otherwise dx and the
// column partials run as two kernels. Either way the parameter sums go through f32 partials.
constexpr int kNormFusedWarps = 4;
constexpr size_t kNormFusedSharedLimit = 96 * 1024;
int64_t norm_fused_chunks(int64_t rows);                 // >= 32 rows a chunk, about 512 chunks
int norm_fused_vectors_per_lane(int64_t cols, int width);  // 4, 8 or 16; 0 = too wide
// Floats of one warp's row of sums. 8-wide vectors are laid out in 256-column groups, each
// group's two 4-float halves of its 32 lanes' vectors one after the other (the kernel's
// shared_slot), so a last, partial group of r vectors ends at 128 + 4r floats into the group:
// GPT-2 1.5B's 1600 columns need 1696 floats, not 1792 (four blocks with a bias row then take
// 216 of an SM's 228 KiB of shared memory, where the padded rows took all of it).
constexpr int64_t norm_fused_row_floats(int64_t cols, bool vector) {
  if (!vector || cols % 256 == 0) return cols;
  return cols / 256 * 256 + 128 + 4 * ((cols % 256 + 7) / 8);
}
// Rows of 2049-4096 16-bit columns with 8-wide loads run the fused backward on pairs of warps:
// the first warp of a pair takes the row's columns [0, split), the second [split, cols), each
// holding its part in registers as the rows of at most 2048 columns are held, and the pair adds
// its two halves of the row sums through shared memory. Returns split (whole 256-column groups,
// the first half taking the odd one), 0 where rows are not split. Such rows' sums always fit the
// fused kernel's shared memory (at most 64 KiB with a bias), so the two-kernel path never takes
// them. So do a LayerNorm's rows of 1025-2048 columns (`layer`; GPT-2 1.5B's 1600): whole, a lane
// holds 5-8 vectors of dout and x but not the incoming dx, which its second pass then reads
// two vectors ahead at a time, several memory latencies a row; split into halves of at most 1024
// columns (the first taking the odd vector: 1600 -> 800 + 800), a lane holds all three and a row
// costs one (GPT-2 1.5B's norm backward on an H100: 90 -> 83 us a launch in a step). dx's column
// sums stay apart for split rows: fused into the halves (57 KiB a block, three blocks an SM) the
// kernel took 133 us, more than the 83 us plus two column-sum kernels.
constexpr int64_t norm_split_columns(int64_t cols, bool vector, bool sixteen_bit, bool layer = false) {
  if (!vector || !sixteen_bit || cols > 4096) return 0;
  if (cols > 2048) return ((cols + 255) / 256 + 1) / 2 * 256;
  if (layer && cols > 1024) return (cols / 8 + 1) / 2 * 8;
  return 0;
}
// Rows of sums a warp keeps: dweight's, dbias's with a bias, and dx's column sums in and out, of
// the row's width or, split, of its first part's (and the pairs' exchange of row sums).
size_t norm_fused_shared_bytes(int64_t cols, bool with_bias, bool vector, bool dx_sums = false, int64_t split = 0);
// The pairs' exchange of a split row's sums: [2 rows in flight][pairs][2 halves][2 sums] floats.
constexpr size_t kNormSplitExchangeBytes = 2 * (kNormFusedWarps / 2) * 2 * 2 * sizeof(float);

// dx's column sums (DxColumnSums) ride on the fused kernel when both are asked for, its loads are
// 8-wide and the two more rows of sums still fit the shared-memory limit (GPT-2 124M's 768
// columns: 48 KiB a block); otherwise each runs as a column-sum kernel over dx, the incoming one
// before the norm's kernels and the outgoing one after them.
struct NormBackwardPlan {
  bool vector = false;   // 8-wide loads (cols % 8 == 0, 16-byte aligned operands)
  bool with_bias = false;
  int lanes = 0;         // the fused kernel's vectors per lane
  int64_t split = 0;     // norm_split_columns: rows split over pairs of warps (0: not split)
  bool fused = false;
  bool dx_sums = false;  // the fused kernel takes dx's column sums in and out
  int64_t chunks = 0;    // row chunks of the partial sums (0: no partials)
  // "norm_backward.partials" f32 [chunks x (1 + with_bias + 2 dx_sums), cols]: dweight's, dbias's,
  // then dx's in and out
  PrivateBuffers buffers;
  int64_t partial_rows() const { return 1 + static_cast<int64_t>(with_bias) + 2 * static_cast<int64_t>(dx_sums); }
};
NormBackwardPlan norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                               const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                               const DxColumnSums& dx_sums = {});

// ---- AdamW ------------------------------------------------------------------------------------
constexpr int kAdamwThreads = 256;
struct AdamwPlan {
  bool vector = false;   // a thread per 8-element vector (n % 8 == 0, 16-byte aligned operands)
  int64_t blocks = 0;    // of kAdamwThreads
  PrivateBuffers buffers;  // with a norm output: "adamw.norm_partials" f32 [blocks], one a block
};
AdamwPlan adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& compute_copy,
                const AdamWArgs& args);

// ---- embedding backward -----------------------------------------------------------------------
// Bits of the radix sort's keys: tokens and the sentinel `vocab` must fit.
int embedding_sort_key_bits(int64_t vocab);
// "embedding_backward.keys" and ".rows" i32 [2, tokens] (in and out of the sort), then ".sort",
// cub's temp storage of `sort_temp_bytes` (a device fact); nothing for 0 tokens.
PrivateBuffers embedding_backward(int64_t tokens, size_t sort_temp_bytes);

// ---- linear -----------------------------------------------------------------------------------
// Held through the weight-gradient GEMM: "linear.weight_grad" f32 [dweight] when f32 activations
// meet a 16-bit gradient (no cuBLASLt f32 x f32 -> bf16 GEMM); "linear.bias_grad" f32 [cols] when
// the bias gradient rides on the GEMM (BGRADB, `fused_bias`). An unfused bias gradient adds
// column_sum(dout) after it.
PrivateBuffers linear_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight, const Tensor& dbias,
                                      bool fused_bias);
// A backward_input GEMM with the dgelu epilogue that sums the bias gradient
// (Backend::gemm_fuses_dgelu_bias_gradient): "gemm.dgelu_bias_partials" f32 [rows, dx.cols()],
// one row of sums per tile of kDgeluBiasTileRows or more rows (quack's DGELU GEMM) or per
// column_reduction_chunks chunk (cuBLASLt's DGELU and the column-sum kernel, where the autotune
// or the operands take that path), whichever is more; nothing for an empty dx.
constexpr int64_t kDgeluBiasTileRows = 128;
PrivateBuffers dgelu_bias_gradient(const Tensor& dx);
// NVFP4 GEMMs read their two global scales from "gemm.nvfp4_scalars" f32 [2].
PrivateBuffers linear_quantized(ScalingMode mode);

// ---- the LM head with its loss (Backend::head_loss fused: quack's linear cross-entropy) ---------
// The forward GEMM's column tile, one exp offset and one partial sum per (row, tile): 192 where it
// divides the padded vocabulary, else 256 where that does, else 0 (no fused pipeline).
int64_t head_loss_tile(int64_t padded_vocab);
// Why chunk `c` cannot run as the fused pipeline, "" when it can: BF16 x, weight, logits and dx, an
// f32 dweight, all contiguous; rows and the padded vocabulary V multiples of 128, V of a tile, the
// hidden size of 8; padding that leaves a valid column in the last tile (a tile of padding alone
// would have no finite maximum).
std::string head_loss_unfusable(const HeadLossChunk& c);
struct HeadLossPlan {
  int64_t tile = 0, tiles = 0, partials_ld = 0;  // V / tile, and that rounded up to 4 (16-byte rows)
  // Scratch held through the op: "head_loss.mask" f32 [V] (0, or -inf in padding columns);
  // "head_loss.partials" f32 [2, rows, partials_ld] (the tiles' sums, then their offsets);
  // "head_loss.rows" f32 [3, rows] (target logits, largest offsets, row scales v);
  // "head_loss.strip" bf16 [V / 64, rows] (the per-(64 columns, row) scales u);
  // "head_loss.scaled_x" bf16 [rows, hidden] (x · v, the weight gradient's operand).
  PrivateBuffers buffers;
  double glue_flops = 0, glue_bytes = 0;  // the glue kernels' (recorded as the cross-entropy op)
};
HeadLossPlan head_loss(const HeadLossChunk& c);

// ---- RoPE, attention --------------------------------------------------------------------------
// One cos/sin table f32 [2, positions, head_dim/2] per (positions, head_dim, theta), kept
// (workspace). positions = rope_table_positions(shape): the sequence length in training; past a
// position offset (generation with a cache), the power of two at or above offset + seq, so a
// generation of n tokens builds about log2(n) tables, not n.
int64_t rope_table_positions(int64_t seq, int64_t position_offset);
PrivateBuffer rope_table(int64_t positions, int64_t head_dim);
// cuDNN has no f32 SDPA: f32 activations run on bf16 copies, held through the call.
PrivateBuffers attention_forward(const Tensor& qkv, const Tensor& out);
PrivateBuffers attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& dqkv);
// The one "cudnn.workspace" is replaced only by a larger request: the new buffer when
// `requested_bytes` (a device fact: what the graph's plan asks for) exceeds `held_bytes`.
std::optional<PrivateBuffer> attention_workspace(size_t held_bytes, int64_t requested_bytes);
// FlashAttention-4's Hopper backward (train.attention_backward = flash-attention-4) in that same
// workspace: its FP32 buffers as flash_attn/cute/interface.py sizes them for a causal bf16
// backward on sm_90, each at a 256-byte boundary. Rows are rounded to its tiles (query_tile 128
// for head dimensions up to 64, else 64; key_tile 128), the head dimension to 32.
struct FlashAttention4Workspace {
  int64_t query_tile = 0, key_tile = 0, rounded_head_dim = 0, seq_q_rounded = 0, seq_k_rounded = 0;
  int64_t dq_accum_bytes = 0;   // dQ summed over the key tiles: f32 [batch, heads, seq_q_rounded * rounded_head_dim]
  int64_t row_bytes = 0;        // each of the softmax-gradient rowsum and the log2 LSE: f32 [batch, heads, seq_q_rounded]
  int64_t dkv_accum_bytes = 0;  // each of dK and dV summed over a group's query heads (grouped heads only):
                                // f32 [batch, kv_heads, seq_k_rounded * rounded_head_dim]
  int64_t dq_accum_offset() const { return 0; }
  int64_t dpsum_offset() const { return dq_accum_bytes; }
  int64_t lse_log2_offset() const { return dq_accum_bytes + row_bytes; }
  int64_t dk_accum_offset() const { return dq_accum_bytes + 2 * row_bytes; }
  int64_t dv_accum_offset() const { return dk_accum_offset() + dkv_accum_bytes; }
  int64_t bytes() const { return dv_accum_offset() + dkv_accum_bytes; }
};
FlashAttention4Workspace flash_attention_4_workspace(const AttentionShape& shape);
// Why FlashAttention-4's backward cannot run `shape` with `io` activations (f32 runs on bf16
// copies, as cuDNN's does), "" when it can: bf16, a head dimension of 8..128 in multiples of 8,
// and more than one tile of rows (more than 128: the library compiles a single-tile variant
// apart, which mxtrain does not carry). Which (head dimension, group) pairs a build carries is
// the build's (backend/cuda/flash_attention_4.hpp).
std::string flash_attention_4_unsupported(const AttentionShape& shape, DType io);

// ---- device facts -----------------------------------------------------------------------------
// Keys of the facts above, so a cuda run can record them and a dryrun can be given them.
std::string attention_workspace_fact(const AttentionShape& shape, DType io, bool backward, bool deterministic);
std::string embedding_sort_fact(int64_t tokens, int key_bits);

struct DeviceFacts {
  std::map<std::string, int64_t> bytes;
  void record(const std::string& key, int64_t value) { bytes[key] = value; }
  std::optional<int64_t> find(const std::string& key) const {
    auto found = bytes.find(key);
    if (found == bytes.end()) return std::nullopt;
    return found->second;
  }
};

}  // namespace mxtrain::private_buffers
