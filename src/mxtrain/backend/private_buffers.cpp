#include "mxtrain/backend/private_buffers.hpp"

#include <bit>

#include <algorithm>

#include "mxtrain/core/error.hpp"

namespace mxtrain::private_buffers {
namespace {

bool aligned16(const Tensor& tensor) { return !tensor.defined() || (reinterpret_cast<uintptr_t>(tensor.data) & 15u) == 0; }

PrivateBuffer f32(const std::string& name, Shape shape, Lifetime lifetime = Lifetime::scratch) {
  return PrivateBuffer{name, shape, DType::f32, lifetime};
}

}  // namespace

Buffer allocate_private(Backend& backend, const PrivateBuffer& buffer) {
  return backend.allocate(buffer.name, buffer.shape, buffer.dtype, buffer.lifetime);
}

std::vector<Buffer> allocate_private(Backend& backend, const PrivateBuffers& buffers) {
  std::vector<Buffer> held;
  held.reserve(buffers.size());
  for (const PrivateBuffer& buffer : buffers) held.push_back(allocate_private(backend, buffer));
  return held;
}

PrivateBuffers backend_workspaces() {
  return {PrivateBuffer{"cublaslt.workspace", Shape{static_cast<int64_t>(kGemmWorkspaceBytes)}, DType::u8,
                        Lifetime::workspace},
          f32("reduction.partials", Shape{kReductionBlocks}, Lifetime::workspace)};
}

int64_t column_reduction_chunks(int64_t rows) {
  // For the row counts of a training step (16k-64k) that is 512 blocks of partial sums, enough
  // to fill the GPU, and a partial buffer that adds only a few percent to the bytes read.
  const int64_t rows_per_chunk = std::max<int64_t>(32, (rows + 511) / 512);
  return std::max<int64_t>(1, (rows + rows_per_chunk - 1) / rows_per_chunk);
}

PrivateBuffers column_sum(const Tensor& x) {
  if (x.numel() == 0) return {};
  return {f32("column_sum.partials", Shape{column_reduction_chunks(x.rows()), x.cols()})};
}

PrivateBuffers qkv_bias_gradient(const Tensor& dqkv, int64_t hidden) {
  return column_sum(dqkv.flatten_rows().narrow(1, 0, hidden));
}

PrivateBuffers dgelu_bias_gradient(const Tensor& dx) {
  if (dx.numel() == 0) return {};
  const int64_t tiles = (dx.rows() + kDgeluBiasTileRows - 1) / kDgeluBiasTileRows;
  return {f32("gemm.dgelu_bias_partials", Shape{std::max(tiles, column_reduction_chunks(dx.rows())), dx.cols()})};
}

// About 512 chunks, at least 32 rows each (8 per warp, so the per-chunk partial row stays small
// next to the rows' traffic); a function of the row count only, so results do not depend on the
// GPU. (16-row chunks, up to 4096 of them, measured no faster on an H200: llama-1b's RMSNorm
// backward 4.35 against 4.28 ms a step, and their partial rows cost the column reductions 0.1 ms
// more.)
int64_t norm_fused_chunks(int64_t rows) {
  const int64_t rows_per_chunk = std::max<int64_t>(32, (rows + 511) / 512);
  return (rows + rows_per_chunk - 1) / rows_per_chunk;
}

int norm_fused_vectors_per_lane(int64_t cols, int width) {
  const int64_t needed = (cols / width + 31) / 32;
  if (needed <= 4) return 4;
  if (needed <= 8) return 8;
  if (needed <= 16) return 16;
  return 0;
}

size_t norm_fused_shared_bytes(int64_t cols, bool with_bias, bool vector, bool dx_sums, int64_t split) {
  const size_t rows = 1 + static_cast<size_t>(with_bias) + 2 * static_cast<size_t>(dx_sums);
  const size_t sums = static_cast<size_t>(kNormFusedWarps) * rows *
                      static_cast<size_t>(norm_fused_row_floats(split > 0 ? split : cols, vector)) * sizeof(float);
  return split > 0 ? sums + kNormSplitExchangeBytes : sums;
}

NormBackwardPlan norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight,
                               const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                               const DxColumnSums& dx_sums) {
  NormBackwardPlan plan;
  if (x.numel() == 0) return plan;
  const int64_t rows = x.rows(), cols = x.cols();
  plan.with_bias = kind == NormKind::layer && dbias.defined();
  plan.vector = cols % 8 == 0 && aligned16(x) && aligned16(dout) && aligned16(dx) && aligned16(weight);
  plan.lanes = norm_fused_vectors_per_lane(cols, plan.vector ? 8 : 1);
  plan.split = norm_split_columns(cols, plan.vector, x.dtype == DType::bf16 || x.dtype == DType::f16,
                                  kind == NormKind::layer);
  plan.fused = dweight.defined() && plan.lanes > 0 &&
               norm_fused_shared_bytes(cols, plan.with_bias, plan.vector, false, plan.split) <= kNormFusedSharedLimit;
  // (The kernel is built for it with 16-bit activations and norm weights of the same dtype, at
  // most 8 vectors a lane, rows not split: up to 2048 columns for RMSNorm, 1024 for LayerNorm.
  // Split halves with the sums fit, but measured slower than without them plus the two
  // column-sum kernels: bench/results/h100_norm_layer_split_61b8e5c.md.)
  plan.dx_sums = plan.fused && plan.vector && plan.lanes <= 8 && plan.split == 0 && dx_sums.in.defined() &&
                 dx_sums.out.defined() && (x.dtype == DType::bf16 || x.dtype == DType::f16) &&
                 weight.dtype == x.dtype &&
                 norm_fused_shared_bytes(cols, plan.with_bias, plan.vector, true) <= kNormFusedSharedLimit;
  if (!plan.fused && !dweight.defined()) return plan;
  plan.chunks = plan.fused ? norm_fused_chunks(rows) : column_reduction_chunks(rows);
  plan.buffers.push_back(f32("norm_backward.partials", Shape{plan.partial_rows() * plan.chunks, cols}));
  return plan;
}

int64_t head_loss_tile(int64_t padded_vocab) {
  if (padded_vocab > 0 && padded_vocab % 192 == 0) return 192;
  if (padded_vocab > 0 && padded_vocab % 256 == 0) return 256;
  return 0;
}

std::string head_loss_unfusable(const HeadLossChunk& c) {
  const int64_t rows = c.x.rows(), hidden = c.x.cols(), vocab = c.logits.cols();
  if (!c.dx.defined() || !c.dweight.defined()) return "not training";
  if (c.x.dtype != DType::bf16 || c.weight.dtype != DType::bf16 || c.logits.dtype != DType::bf16 ||
      c.dx.dtype != DType::bf16)
    return "BF16 activations and head weight";
  if (c.dweight.dtype != DType::f32) return "an f32 head gradient";
  for (const Tensor* t : {&c.x, &c.weight, &c.logits, &c.dx, &c.dweight, &c.targets, &c.losses})
    if (!t->is_contiguous()) return "contiguous operands";
  if (rows <= 0 || rows % 128) return "rows in multiples of 128";
  const int64_t tile = head_loss_tile(vocab);
  if (vocab % 128 || tile == 0) return "a padded vocabulary in multiples of 128 and of 192 or 256";
  if (hidden % 8) return "a hidden size in multiples of 8";
  if (c.valid_vocab <= vocab - tile) return "a valid column in the last tile";
  for (const Tensor* t : {&c.x, &c.weight, &c.logits, &c.dx, &c.dweight})
    if (!aligned16(*t)) return "16-byte aligned operands";
  return "";
}

HeadLossPlan head_loss(const HeadLossChunk& c) {
  HeadLossPlan plan;
  const int64_t rows = c.x.rows(), hidden = c.x.cols(), vocab = c.logits.cols();
  plan.tile = head_loss_tile(vocab);
  plan.tiles = plan.tile > 0 ? vocab / plan.tile : 0;
  plan.partials_ld = (plan.tiles + 3) / 4 * 4;
  plan.buffers = {f32("head_loss.mask", Shape{vocab}), f32("head_loss.partials", Shape{2, rows, plan.partials_ld}),
                  f32("head_loss.rows", Shape{3, rows}),
                  PrivateBuffer{"head_loss.strip", Shape{vocab / 64, rows}, DType::bf16, Lifetime::scratch},
                  PrivateBuffer{"head_loss.scaled_x", Shape{rows, hidden}, DType::bf16, Lifetime::scratch}};
  const double r = static_cast<double>(rows), partials = r * static_cast<double>(plan.tiles);
  // Rows: both partials in and the offsets again for the strip, x in and x · v out, the target
  // logits and targets in, the loss and two row scalars out; the strip out.
  plan.glue_bytes = 3 * 4 * partials + 2 * 2 * r * static_cast<double>(hidden) + 6 * 4 * r +
                    2 * static_cast<double>(vocab / 64) * r;
  plan.glue_flops = 4 * partials + r * static_cast<double>(hidden);
  return plan;
}

AdamwPlan adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& compute_copy,
                const AdamWArgs& args) {
  AdamwPlan plan;
  const int64_t n = grad.numel();
  if (n == 0) return plan;
  plan.vector = n % 8 == 0 && aligned16(param) && aligned16(grad) && aligned16(m) && aligned16(v) &&
                aligned16(compute_copy) && aligned16(args.master_low);
  const int64_t threads = plan.vector ? n / 8 : n;
  plan.blocks = (threads + kAdamwThreads - 1) / kAdamwThreads;
  if (args.grad_norm_output != AdamWArgs::NormOutput::none)
    plan.buffers.push_back(f32("adamw.norm_partials", Shape{plan.blocks}));
  return plan;
}

int embedding_sort_key_bits(int64_t vocab) {
  int bits = 1;
  while ((int64_t{1} << bits) <= vocab) ++bits;
  return bits;
}

PrivateBuffers embedding_backward(int64_t tokens, size_t sort_temp_bytes) {
  if (tokens == 0) return {};
  return {PrivateBuffer{"embedding_backward.keys", Shape{2, tokens}, DType::i32, Lifetime::scratch},
          PrivateBuffer{"embedding_backward.rows", Shape{2, tokens}, DType::i32, Lifetime::scratch},
          PrivateBuffer{"embedding_backward.sort", Shape{static_cast<int64_t>(sort_temp_bytes)}, DType::u8,
                        Lifetime::scratch}};
}

PrivateBuffers linear_backward_weight(const Tensor& dout, const Tensor& x, const Tensor& dweight, const Tensor& dbias,
                                      bool fused_bias) {
  PrivateBuffers buffers;
  if (x.rows() == 0) return buffers;
  if (x.dtype == DType::f32 && dweight.dtype != DType::f32) buffers.push_back(f32("linear.weight_grad", dweight.shape));
  if (dbias.defined() && fused_bias) buffers.push_back(f32("linear.bias_grad", Shape{dout.cols()}));
  return buffers;
}

PrivateBuffers linear_quantized(ScalingMode mode) {
  if (mode != ScalingMode::nvfp4) return {};
  return {f32("gemm.nvfp4_scalars", Shape{2})};
}

int64_t rope_table_positions(int64_t seq, int64_t position_offset) {
  if (position_offset == 0) return seq;
  return static_cast<int64_t>(std::bit_ceil(static_cast<uint64_t>(position_offset + seq)));
}

PrivateBuffer rope_table(int64_t positions, int64_t head_dim) {
  return f32(strf("rope.table.seq%lld.dim%lld", static_cast<long long>(positions), static_cast<long long>(head_dim)),
             Shape{2, positions, head_dim / 2}, Lifetime::workspace);
}

PrivateBuffers attention_forward(const Tensor& qkv, const Tensor& out) {
  if (qkv.dtype != DType::f32) return {};
  return {PrivateBuffer{"attention.qkv_bf16", qkv.shape, DType::bf16, Lifetime::scratch},
          PrivateBuffer{"attention.out_bf16", out.shape, DType::bf16, Lifetime::scratch}};
}

PrivateBuffers attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& dqkv) {
  if (qkv.dtype != DType::f32) return {};
  return {PrivateBuffer{"attention.dout_bf16", dout.shape, DType::bf16, Lifetime::scratch},
          PrivateBuffer{"attention.qkv_bf16", qkv.shape, DType::bf16, Lifetime::scratch},
          PrivateBuffer{"attention.out_bf16", out.shape, DType::bf16, Lifetime::scratch},
          PrivateBuffer{"attention.dqkv_bf16", dqkv.shape, DType::bf16, Lifetime::scratch}};
}

std::optional<PrivateBuffer> attention_workspace(size_t held_bytes, int64_t requested_bytes) {
  MXTRAIN_ASSERT(requested_bytes >= 0, "attention workspace request of %lld bytes", static_cast<long long>(requested_bytes));
  if (static_cast<size_t>(requested_bytes) <= held_bytes) return std::nullopt;
  return PrivateBuffer{"cudnn.workspace", Shape{requested_bytes}, DType::u8, Lifetime::workspace};
}

FlashAttention4Workspace flash_attention_4_workspace(const AttentionShape& shape) {
  auto round_up = [](int64_t value, int64_t multiple) { return (value + multiple - 1) / multiple * multiple; };
  FlashAttention4Workspace w;
  w.query_tile = shape.head_dim <= 64 ? 128 : 64;
  w.key_tile = 128;
  w.rounded_head_dim = round_up(shape.head_dim, 32);
  w.seq_q_rounded = round_up(shape.seq, w.query_tile);
  w.seq_k_rounded = round_up(shape.seq, w.key_tile);
  w.dq_accum_bytes = round_up(4 * shape.batch * shape.heads * w.seq_q_rounded * w.rounded_head_dim, 256);
  w.row_bytes = round_up(4 * shape.batch * shape.heads * w.seq_q_rounded, 256);
  if (shape.kv_heads < shape.heads)
    w.dkv_accum_bytes = round_up(4 * shape.batch * shape.kv_heads * w.seq_k_rounded * w.rounded_head_dim, 256);
  return w;
}

std::string flash_attention_4_unsupported(const AttentionShape& shape, DType io) {
  if (io != DType::bf16 && io != DType::f32)
    return strf("its kernels are built for bf16 activations, not %s", std::string(dtype_name(io)).c_str());
  if (shape.head_dim < 8 || shape.head_dim > 128 || shape.head_dim % 8 != 0)
    return strf("head_dim %lld: it runs 8..128 in multiples of 8", static_cast<long long>(shape.head_dim));
  if (shape.kv_heads <= 0 || shape.heads % shape.kv_heads != 0) return "heads must be a multiple of kv_heads";
  if (shape.seq <= 128)
    return strf("seq %lld: it needs more than 128 rows (one tile is a variant of its own)",
                static_cast<long long>(shape.seq));
  return "";
}

std::string attention_workspace_fact(const AttentionShape& shape, DType io, bool backward, bool deterministic) {
  return strf("sdpa.%s.b%lld.s%lld.h%lld.kv%lld.d%lld.%s%s", backward ? "backward" : "forward",
              static_cast<long long>(shape.batch), static_cast<long long>(shape.seq),
              static_cast<long long>(shape.heads), static_cast<long long>(shape.kv_heads),
              static_cast<long long>(shape.head_dim), std::string(dtype_name(io)).c_str(),
              backward && deterministic ? ".deterministic" : "");
}

std::string embedding_sort_fact(int64_t tokens, int key_bits) {
  return strf("cub.sort_pairs.n%lld.bits%d", static_cast<long long>(tokens), key_bits);
}

}  // namespace mxtrain::private_buffers
