// The one description of the cuda backend's private buffers (backend/private_buffers.hpp):
// its functions against the kernels' own rules, worked out by hand, and the dryrun (with the
// CUDA allocation model on) running real training steps: every op's private allocations are
// exactly the list the functions return for that op's arguments, in order, and its scratch is
// gone when the op returns. The GPU half (the cuda backend allocating the same lists) is
// tests/cuda/cuda_private_buffers_test.cpp.
#include <gtest/gtest.h>

#include <set>
#include <tuple>

#include "mxtrain/backend/dryrun/dryrun_backend.hpp"
#include "mxtrain/backend/private_buffers.hpp"
#include "mxtrain/hw/gpu_catalog.hpp"
#include "mxtrain/plan/calibration.hpp"
#include "mxtrain/train/precision.hpp"
#include "mxtrain/train/session.hpp"
#include "plan/plan_test_support.hpp"

namespace mxtrain::test {
namespace {

namespace pb = private_buffers;

// Tensors at fake addresses: only shape, dtype and alignment matter to the description.
Tensor at(uintptr_t address, Shape shape, DType dtype) {
  return Tensor(reinterpret_cast<void*>(address), shape, dtype, Device::none);
}
constexpr uintptr_t kAligned = uintptr_t{1} << 20;

TEST(PrivateBuffers, WorkspacesAtCreation) {
  const pb::PrivateBuffers list = pb::backend_workspaces();
  ASSERT_EQ(list.size(), 2u);
  EXPECT_EQ(list[0].name, "cublaslt.workspace");
  EXPECT_EQ(list[0].bytes(), size_t{32} << 20);
  EXPECT_EQ(list[1].name, "reduction.partials");
  EXPECT_EQ(list[1].bytes(), 1024u * 4u);
  for (const pb::PrivateBuffer& buffer : list) EXPECT_EQ(buffer.lifetime, Lifetime::workspace);
}

TEST(PrivateBuffers, ColumnReductionChunks) {
  // At least 32 rows a chunk, at most 512 chunks.
  EXPECT_EQ(pb::column_reduction_chunks(1), 1);
  EXPECT_EQ(pb::column_reduction_chunks(32), 1);
  EXPECT_EQ(pb::column_reduction_chunks(33), 2);
  EXPECT_EQ(pb::column_reduction_chunks(4096), 128);
  EXPECT_EQ(pb::column_reduction_chunks(16384), 512);
  EXPECT_EQ(pb::column_reduction_chunks(16385), 497);  // 33 rows a chunk
  EXPECT_EQ(pb::column_reduction_chunks(65536), 512);
  const pb::PrivateBuffers sums = pb::column_sum(at(kAligned, Shape{16384, 2304}, DType::bf16));
  ASSERT_EQ(sums.size(), 1u);
  EXPECT_EQ(sums[0], (pb::PrivateBuffer{"column_sum.partials", Shape{512, 2304}, DType::f32, Lifetime::scratch}));
  EXPECT_TRUE(pb::column_sum(at(kAligned, Shape{0, 8}, DType::bf16)).empty());
}

TEST(PrivateBuffers, NormBackwardPaths) {
  auto plan_for = [](NormKind kind, int64_t rows, int64_t cols, DType dtype, bool bias, uintptr_t x_address) {
    const Tensor x = at(x_address, Shape{rows, cols}, dtype), dout = at(kAligned, Shape{rows, cols}, dtype);
    const Tensor dx = at(kAligned, Shape{rows, cols}, dtype), weight = at(kAligned, Shape{cols}, DType::f32);
    const Tensor dweight = at(kAligned, Shape{cols}, DType::f32);
    const Tensor dbias = bias ? at(kAligned, Shape{cols}, DType::f32) : Tensor();
    return pb::norm_backward(kind, dout, x, weight, dx, dweight, dbias);
  };
  // llama-1b's RMSNorm, 2048 bf16 columns: fused, 8 vectors a lane, 32 rows a chunk.
  pb::NormBackwardPlan rms = plan_for(NormKind::rms, 4096, 2048, DType::bf16, false, kAligned);
  EXPECT_TRUE(rms.fused && rms.vector);
  EXPECT_EQ(rms.lanes, 8);
  EXPECT_EQ(rms.chunks, 128);
  ASSERT_EQ(rms.buffers.size(), 1u);
  EXPECT_EQ(rms.buffers[0], (pb::PrivateBuffer{"norm_backward.partials", Shape{128, 2048}, DType::f32, Lifetime::scratch}));
  // 5120 columns need 20 vectors a lane: two kernels, the column reduction's chunks.
  pb::NormBackwardPlan wide = plan_for(NormKind::rms, 16385, 5120, DType::bf16, false, kAligned);
  EXPECT_FALSE(wide.fused);
  EXPECT_EQ(wide.chunks, 497);
  EXPECT_EQ(wide.buffers.at(0).shape, (Shape{497, 5120}));
  // LayerNorm with a bias, 3200 columns: whole rows of sums (3072 + 128 + 4 * 16 = 3264 floats:
  // the last 256-column group holds 16 vectors) would take 102 KiB of shared memory, over the
  // 96 KiB limit, so FP32 rows run two kernels; 16-bit rows are split over pairs of warps at
  // 1792 columns (13 groups: 7 and 6), the sums' rows of the first part's width plus the pairs'
  // exchange (57 KiB), and fuse. 1600 columns (1536 + 128 + 4 * 8 = 1696 floats, 53 KiB) fit,
  // four blocks with the 1 KiB each that the GPU reserves within an SM's 228 KiB (rows padded to
  // 1792 floats filled them to the byte).
  EXPECT_EQ(pb::norm_fused_row_floats(3200, true), 3264);
  EXPECT_EQ(pb::norm_fused_shared_bytes(3200, true, true), 4u * 2u * 3264u * 4u);
  EXPECT_EQ(pb::norm_split_columns(3200, true, true), 1792);
  EXPECT_EQ(pb::norm_fused_shared_bytes(3200, true, true, false, 1792), 4u * 2u * 1792u * 4u + 64u);
  EXPECT_EQ(pb::norm_split_columns(3072, true, true), 1536);  // Llama-3B: 6 groups a part
  EXPECT_EQ(pb::norm_split_columns(4096, true, true), 2048);  // Llama-8B: 8
  EXPECT_EQ(pb::norm_split_columns(2304, true, true), 1280);  // 9 groups: 5 and 4
  EXPECT_EQ(pb::norm_split_columns(2048, true, true), 0);     // held whole
  EXPECT_EQ(pb::norm_split_columns(4104, true, true), 0);     // two kernels
  EXPECT_EQ(pb::norm_split_columns(3072, true, false), 0);    // FP32 rows
  EXPECT_EQ(pb::norm_split_columns(3072, false, true), 0);    // 1-wide loads
  pb::NormBackwardPlan split = plan_for(NormKind::layer, 1024, 3200, DType::bf16, true, kAligned);
  EXPECT_TRUE(split.fused);
  EXPECT_EQ(split.lanes, 16);
  EXPECT_EQ(split.split, 1792);
  EXPECT_EQ(split.buffers.at(0).shape, (Shape{2 * 32, 3200}));
  EXPECT_FALSE(plan_for(NormKind::layer, 1024, 3200, DType::f32, true, kAligned).fused);
  // Every split row runs fused (the plain dx kernel, which sums a row in one part, never takes
  // one): with a bias at 4096 columns the sums take 64 KiB.
  for (int64_t cols = 2056; cols <= 4096; cols += 8) {
    for (DType dtype : {DType::bf16, DType::f16}) {
      const pb::NormBackwardPlan p = plan_for(NormKind::layer, 512, cols, dtype, true, kAligned);
      EXPECT_EQ(p.split, pb::norm_split_columns(cols, true, true)) << cols;
      EXPECT_TRUE(p.split > 0 && p.fused) << cols;
    }
  }
  // A LayerNorm's 16-bit rows of 1025-2048 columns split too, into halves of at most 1024 columns
  // (4 vectors a lane, the incoming dx held); RMSNorm's (held whole with dx) and FP32 rows do not
  // split.
  EXPECT_EQ(pb::norm_split_columns(1600, true, true, true), 800);    // GPT-2 1.5B
  EXPECT_EQ(pb::norm_split_columns(1280, true, true, true), 640);    // GPT-2 774M
  EXPECT_EQ(pb::norm_split_columns(1032, true, true, true), 520);    // 129 vectors: 65 and 64
  EXPECT_EQ(pb::norm_split_columns(2048, true, true, true), 1024);
  EXPECT_EQ(pb::norm_split_columns(1024, true, true, true), 0);      // held whole, dx too
  EXPECT_EQ(pb::norm_split_columns(1600, true, true, false), 0);     // RMSNorm
  EXPECT_EQ(pb::norm_split_columns(1600, true, false, true), 0);     // FP32 rows
  EXPECT_EQ(pb::norm_split_columns(3072, true, true, true), 1536);   // wider rows: as RMSNorm's
  for (int64_t cols = 1032; cols <= 2048; cols += 8) {
    const int64_t split = pb::norm_split_columns(cols, true, true, true);
    EXPECT_TRUE(split % 8 == 0 && split <= 1024 && cols - split <= split && cols - split >= split - 8) << cols;
    for (DType dtype : {DType::bf16, DType::f16}) {
      const pb::NormBackwardPlan p = plan_for(NormKind::layer, 512, cols, dtype, true, kAligned);
      EXPECT_EQ(p.split, split) << cols;
      EXPECT_TRUE(p.fused) << cols;
    }
    EXPECT_EQ(plan_for(NormKind::rms, 512, cols, DType::bf16, false, kAligned).split, 0) << cols;
  }
  EXPECT_EQ(pb::norm_fused_row_floats(1600, true), 1696);
  EXPECT_LE(4 * (pb::norm_fused_shared_bytes(1600, true, true) + 1024), 228u * 1024u);
  EXPECT_EQ(pb::norm_fused_row_floats(2048, true), 2048);  // whole groups: no padding
  EXPECT_EQ(pb::norm_fused_row_floats(1600, false), 1600);  // 1-wide: one float a column
  pb::NormBackwardPlan gpt = plan_for(NormKind::layer, 1024, 1600, DType::bf16, true, kAligned);
  EXPECT_TRUE(gpt.fused);
  EXPECT_EQ(gpt.buffers.at(0).shape, (Shape{2 * 32, 1600}));  // dweight's then dbias's partials
  // A misaligned input takes the 1-wide path: 1600 columns are 50 vectors a lane, too many.
  pb::NormBackwardPlan misaligned = plan_for(NormKind::layer, 1024, 1600, DType::bf16, true, kAligned + 2);
  EXPECT_FALSE(misaligned.vector);
  EXPECT_FALSE(misaligned.fused);
  EXPECT_EQ(misaligned.chunks, 32);
  // Without dweight the two-kernel path allocates nothing.
  const Tensor x = at(kAligned, Shape{64, 5120}, DType::bf16);
  EXPECT_TRUE(pb::norm_backward(NormKind::rms, x, x, at(kAligned, Shape{5120}, DType::f32), x, Tensor(), Tensor())
                  .buffers.empty());
}

TEST(PrivateBuffers, NormBackwardDxColumnSums) {
  auto plan_for = [](NormKind kind, int64_t cols, DType dtype, DType weight_dtype, bool both) {
    const Tensor x = at(kAligned, Shape{1024, cols}, dtype);
    const Tensor weight = at(kAligned, Shape{cols}, weight_dtype), dweight = at(kAligned, Shape{cols}, DType::f32);
    const Tensor dbias = kind == NormKind::layer ? at(kAligned, Shape{cols}, DType::f32) : Tensor();
    const Tensor sum = at(kAligned, Shape{cols}, dtype);
    const DxColumnSums sums{.in = sum, .out = both ? sum : Tensor()};
    return pb::norm_backward(kind, x, x, weight, x, dweight, dbias, sums);
  };
  // GPT-2 124M's LayerNorm: four rows of sums a warp (48 KiB), one partial buffer of four parts.
  const pb::NormBackwardPlan gpt2 = plan_for(NormKind::layer, 768, DType::bf16, DType::bf16, true);
  EXPECT_TRUE(gpt2.fused && gpt2.dx_sums);
  EXPECT_EQ(pb::norm_fused_shared_bytes(768, true, true, true), 4u * 4u * 768u * 4u);
  EXPECT_EQ(gpt2.buffers.at(0).shape, (Shape{4 * 32, 768}));
  // A LayerNorm's rows of 1025-2048 columns run split (GPT-2 1.5B's 1600: 800 + 800), and split
  // rows keep dx's sums apart: their halves would fit them (57 KiB a block at 1600) but measured
  // slower than the two column-sum kernels beside the kernel without them.
  const pb::NormBackwardPlan xl = plan_for(NormKind::layer, 1600, DType::bf16, DType::bf16, true);
  EXPECT_TRUE(xl.fused);
  EXPECT_FALSE(xl.dx_sums);
  EXPECT_EQ(xl.split, 800);
  EXPECT_EQ(xl.buffers.at(0).shape, (Shape{2 * 32, 1600}));
  for (int64_t cols = 1032; cols <= 2048; cols += 8) {
    const pb::NormBackwardPlan p = plan_for(NormKind::layer, cols, DType::bf16, DType::bf16, true);
    EXPECT_TRUE(p.fused && !p.dx_sums && p.split > 0) << cols;
  }
  EXPECT_TRUE(plan_for(NormKind::layer, 1024, DType::bf16, DType::bf16, true).dx_sums);  // whole: 64 KiB
  // Only both sums at once, 16-bit activations, norm weights of their dtype.
  EXPECT_FALSE(plan_for(NormKind::layer, 768, DType::bf16, DType::bf16, false).dx_sums);
  EXPECT_FALSE(plan_for(NormKind::layer, 768, DType::f32, DType::f32, true).dx_sums);
  EXPECT_FALSE(plan_for(NormKind::layer, 768, DType::bf16, DType::f32, true).dx_sums);
  EXPECT_TRUE(plan_for(NormKind::rms, 2048, DType::bf16, DType::bf16, true).dx_sums);  // three rows: 96 KiB
  EXPECT_FALSE(plan_for(NormKind::rms, 4096, DType::bf16, DType::bf16, true).dx_sums);  // 16 vectors a lane
}

// The LM head's loss as quack's linear cross-entropy (Backend::head_loss, fused): which chunks it
// takes, its forward tile, and its scratch at gpt2-124m's 8,192-row chunk (41.1 MiB: the peak
// difference measured on an H100, bench/results/h100_head_loss_41df6d7.md).
TEST(PrivateBuffers, HeadLossFusedScratch) {
  auto chunk_for = [](int64_t rows, int64_t hidden, int64_t vocab, int64_t valid, DType dtype = DType::bf16,
                      DType grad = DType::f32, bool training = true) {
    HeadLossChunk c;
    c.x = at(kAligned, Shape{rows, hidden}, dtype);
    c.weight = at(kAligned, Shape{vocab, hidden}, dtype);
    c.targets = at(kAligned, Shape{rows}, DType::i32);
    c.losses = at(kAligned, Shape{rows}, DType::f32);
    c.logits = at(kAligned, Shape{rows, vocab}, dtype);
    c.valid_vocab = valid;
    if (training) {
      c.dx = at(kAligned, Shape{rows, hidden}, dtype);
      c.dweight = at(kAligned, Shape{vocab, hidden}, grad);
    }
    return c;
  };
  EXPECT_EQ(pb::head_loss_tile(50304), 192);   // GPT-2's padded vocabulary
  EXPECT_EQ(pb::head_loss_tile(128256), 192);  // Llama 3's
  EXPECT_EQ(pb::head_loss_tile(32000), 256);   // TinyLlama's (llama-1b)
  EXPECT_EQ(pb::head_loss_tile(50257), 0);
  EXPECT_EQ(pb::head_loss_unfusable(chunk_for(8192, 768, 50304, 50257)), "");
  EXPECT_EQ(pb::head_loss_unfusable(chunk_for(8192, 2048, 32000, 32000)), "");
  EXPECT_NE(pb::head_loss_unfusable(chunk_for(8192, 768, 50304, 50257, DType::f32)), "");
  EXPECT_NE(pb::head_loss_unfusable(chunk_for(8192, 768, 50304, 50257, DType::bf16, DType::bf16)), "");
  EXPECT_NE(pb::head_loss_unfusable(chunk_for(8192, 768, 50304, 50257, DType::bf16, DType::f32, false)), "");
  EXPECT_NE(pb::head_loss_unfusable(chunk_for(8000, 768, 50304, 50257)), "");   // rows not of 128
  EXPECT_NE(pb::head_loss_unfusable(chunk_for(8192, 764, 50304, 50257)), "");   // hidden not of 8
  EXPECT_NE(pb::head_loss_unfusable(chunk_for(8192, 768, 50304, 50112)), "");   // a last tile of padding alone
  EXPECT_EQ(pb::head_loss_unfusable(chunk_for(8192, 768, 50304, 50113)), "");
  const pb::HeadLossPlan gpt2 = pb::head_loss(chunk_for(8192, 768, 50304, 50257));
  EXPECT_EQ(gpt2.tile, 192);
  EXPECT_EQ(gpt2.tiles, 262);
  EXPECT_EQ(gpt2.partials_ld, 264);
  size_t bytes = 0;
  for (const pb::PrivateBuffer& b : gpt2.buffers) bytes += b.bytes();
  EXPECT_EQ(bytes, 43061760u);
  EXPECT_EQ(gpt2.buffers.at(3), (pb::PrivateBuffer{"head_loss.strip", Shape{786, 8192}, DType::bf16, Lifetime::scratch}));
}

TEST(PrivateBuffers, AdamwNormPartials) {
  AdamWArgs args;
  args.grad_norm_output = AdamWArgs::NormOutput::overwrite;
  auto plan_for = [&](int64_t n, uintptr_t address) {
    const Tensor t = at(address, Shape{n}, DType::f32);
    return pb::adamw(t, t, t, t, Tensor(), args);
  };
  pb::AdamwPlan vector = plan_for(1 << 20, kAligned);  // 131072 threads of 8 elements
  EXPECT_TRUE(vector.vector);
  EXPECT_EQ(vector.blocks, 512);
  EXPECT_EQ(vector.buffers.at(0), (pb::PrivateBuffer{"adamw.norm_partials", Shape{512}, DType::f32, Lifetime::scratch}));
  EXPECT_EQ(plan_for(1001, kAligned).blocks, 4);       // not a multiple of 8: a thread an element
  EXPECT_EQ(plan_for(1 << 20, kAligned + 4).blocks, 4096);  // misaligned: likewise
  args.grad_norm_output = AdamWArgs::NormOutput::none;
  EXPECT_TRUE(plan_for(1 << 20, kAligned).buffers.empty());
}

TEST(PrivateBuffers, EmbeddingLinearRopeAttention) {
  EXPECT_EQ(pb::embedding_sort_key_bits(50257), 16);
  EXPECT_EQ(pb::embedding_sort_key_bits(65535), 16);
  EXPECT_EQ(pb::embedding_sort_key_bits(65536), 17);  // the sentinel key 65536 needs bit 16
  const pb::PrivateBuffers sort = pb::embedding_backward(1000, 12345);
  ASSERT_EQ(sort.size(), 3u);
  EXPECT_EQ(sort[0].bytes(), 8000u);
  EXPECT_EQ(sort[1].name, "embedding_backward.rows");
  EXPECT_EQ(sort[2].bytes(), 12345u);
  EXPECT_TRUE(pb::embedding_backward(0, 0).empty());

  const Tensor dout = at(kAligned, Shape{256, 96}, DType::bf16), x32 = at(kAligned, Shape{256, 64}, DType::f32);
  const Tensor dweight16 = at(kAligned, Shape{96, 64}, DType::bf16), bias = at(kAligned, Shape{96}, DType::bf16);
  EXPECT_EQ(pb::linear_backward_weight(dout, x32, dweight16, bias, false),
            (pb::PrivateBuffers{{"linear.weight_grad", Shape{96, 64}, DType::f32, Lifetime::scratch}}));
  EXPECT_EQ(pb::linear_backward_weight(dout, at(kAligned, Shape{256, 64}, DType::bf16), dweight16, bias, true),
            (pb::PrivateBuffers{{"linear.bias_grad", Shape{96}, DType::f32, Lifetime::scratch}}));
  EXPECT_TRUE(pb::linear_backward_weight(at(kAligned, Shape{0, 96}, DType::bf16), at(kAligned, Shape{0, 64}, DType::f32),
                                         dweight16, bias, true)
                  .empty());
  EXPECT_EQ(pb::linear_quantized(ScalingMode::nvfp4).at(0).bytes(), 8u);
  EXPECT_TRUE(pb::linear_quantized(ScalingMode::mxfp8).empty());

  const pb::PrivateBuffer rope = pb::rope_table(2048, 64);
  EXPECT_EQ(rope.name, "rope.table.seq2048.dim64");
  EXPECT_EQ(rope.bytes(), 2u * 2048u * 32u * 4u);
  EXPECT_EQ(rope.lifetime, Lifetime::workspace);

  const Tensor qkv32 = at(kAligned, Shape{128, 192}, DType::f32), out32 = at(kAligned, Shape{128, 64}, DType::f32);
  EXPECT_EQ(pb::attention_forward(qkv32, out32).size(), 2u);
  EXPECT_EQ(pb::attention_backward(out32, qkv32, out32, qkv32).at(3),
            (pb::PrivateBuffer{"attention.dqkv_bf16", Shape{128, 192}, DType::bf16, Lifetime::scratch}));
  EXPECT_TRUE(pb::attention_forward(at(kAligned, Shape{128, 192}, DType::bf16), out32).empty());
  EXPECT_FALSE(pb::attention_workspace(0, 0).has_value());  // nothing to hold
  EXPECT_FALSE(pb::attention_workspace(1024, 512).has_value());
  EXPECT_EQ(pb::attention_workspace(512, 1024)->bytes(), 1024u);

  AttentionShape shape{2, 64, 4, 2, 16};
  EXPECT_EQ(pb::attention_workspace_fact(shape, DType::bf16, true, true), "sdpa.backward.b2.s64.h4.kv2.d16.bf16.deterministic");
  EXPECT_EQ(pb::attention_workspace_fact(shape, DType::bf16, false, true), "sdpa.forward.b2.s64.h4.kv2.d16.bf16");
}

// ---- the dryrun's steps -------------------------------------------------------------------------

// Names only the description hands out.
bool private_name(const std::string& name) {
  for (const char* prefix : {"cublaslt.", "reduction.partials", "column_sum.", "norm_backward.", "adamw.",
                             "embedding_backward.", "linear.weight_grad", "linear.bias_grad", "gemm.nvfp4", "gemm.dgelu_bias",
                             "rope.table.", "attention.", "cudnn."})
    if (name.rfind(prefix, 0) == 0) return true;
  return false;
}

struct Event {
  bool is_free;
  std::string name;
  Lifetime lifetime;
  size_t bytes_requested;
};

// The dryrun, checking at every op with private buffers that what it allocated inside the op
// is the description's list for the op's arguments.
class WatchedDryrun final : public DryrunBackend {
 public:
  WatchedDryrun(CudaAllocationModel model) : DryrunBackend(0, "h200", std::move(model)) {
    allocator().set_trace_hook([this](const CachingAllocator::TraceEvent& event) {
      events.push_back(Event{event.is_free, event.name, event.lifetime, event.bytes_requested});
    });
  }
  ~WatchedDryrun() override { allocator().set_trace_hook({}); }

  std::vector<Event> events;
  std::map<std::string, int> checked;  // op -> calls with private buffers checked
  size_t watched_private = 0;          // private allocations inside watched ops

 protected:
  // Runs `op` and compares the allocations it made with `expected`; scratch must be freed again.
  template <typename Op>
  void watch(const std::string& what, const pb::PrivateBuffers& expected, Op op) {
    const size_t begin = events.size();
    ++depth_;
    op();
    --depth_;
    std::vector<Event> made;
    std::map<std::string, int> open_scratch;
    for (size_t i = begin; i < events.size(); ++i) {
      const Event& event = events[i];
      if (!event.is_free) made.push_back(event);
      if (!event.is_free && depth_ == 0 && private_name(event.name)) ++watched_private;
      if (event.lifetime == Lifetime::scratch) open_scratch[event.name] += event.is_free ? -1 : 1;
    }
    ASSERT_EQ(made.size(), expected.size()) << what;
    for (size_t i = 0; i < expected.size(); ++i) {
      EXPECT_EQ(made[i].name, expected[i].name) << what << " allocation " << i;
      EXPECT_EQ(made[i].bytes_requested, expected[i].bytes()) << what << " " << expected[i].name;
      EXPECT_EQ(made[i].lifetime, expected[i].lifetime) << what << " " << expected[i].name;
    }
    for (const auto& [name, count] : open_scratch) EXPECT_EQ(count, 0) << what << ": scratch " << name << " outlives the op";
    if (!expected.empty()) ++checked[what];
  }

  void impl_column_sum(const Tensor& x, const Tensor& out, bool accumulate) override {
    watch("column_sum", pb::column_sum(x), [&] { DryrunBackend::impl_column_sum(x, out, accumulate); });
  }
  void impl_qkv_bias_gradient(const Tensor& dqkv, const Tensor& out_bias_grad, const Tensor& out_weight,
                              const Tensor& qkv_bias_grad, bool accumulate) override {
    watch("qkv_bias_gradient", pb::qkv_bias_gradient(dqkv, out_bias_grad.numel()), [&] {
      DryrunBackend::impl_qkv_bias_gradient(dqkv, out_bias_grad, out_weight, qkv_bias_grad, accumulate);
    });
  }
  void impl_norm_backward(NormKind kind, const Tensor& dout, const Tensor& x, const Tensor& weight, const Tensor& mean,
                          const Tensor& rstd, const Tensor& dx, const Tensor& dweight, const Tensor& dbias,
                          bool accumulate_dx, bool accumulate_dparams, const Tensor& dx_amax,
                          const DxColumnSums& dx_sums) override {
    // dx's column sums that the fused kernel does not take are column-sum kernels around it.
    const pb::NormBackwardPlan plan = pb::norm_backward(kind, dout, x, weight, dx, dweight, dbias, dx_sums);
    pb::PrivateBuffers expected;
    if (!plan.dx_sums && dx_sums.in.defined()) expected = pb::column_sum(dx);
    expected.insert(expected.end(), plan.buffers.begin(), plan.buffers.end());
    if (!plan.dx_sums && dx_sums.out.defined()) {
      const pb::PrivateBuffers after = pb::column_sum(dx);
      expected.insert(expected.end(), after.begin(), after.end());
    }
    watch("norm_backward", expected, [&] {
      DryrunBackend::impl_norm_backward(kind, dout, x, weight, mean, rstd, dx, dweight, dbias, accumulate_dx,
                                        accumulate_dparams, dx_amax, dx_sums);
    });
  }
  void impl_adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v, const Tensor& copy,
                  const Tensor& norm, const AdamWArgs& args) override {
    watch("adamw", pb::adamw(param, grad, m, v, copy, args).buffers,
          [&] { DryrunBackend::impl_adamw(param, grad, m, v, copy, norm, args); });
  }
  void impl_embedding_backward(const Tensor& tokens, const Tensor& dout, const Tensor& dtoken, const Tensor& dposition,
                               int64_t seq_len) override {
    const int bits = pb::embedding_sort_key_bits(dtoken.rows());
    const int64_t sort = cuda_model().embedding_sort_bytes(dout.rows(), bits);
    watch("embedding_backward", pb::embedding_backward(dout.rows(), static_cast<size_t>(sort)),
          [&] { DryrunBackend::impl_embedding_backward(tokens, dout, dtoken, dposition, seq_len); });
    EXPECT_EQ(device_facts_used().find(pb::embedding_sort_fact(dout.rows(), bits)).value_or(-1), sort);
  }
  // The weight-gradient GEMM (plain operands, no epilogue to run apart): its scratch and, where
  // the bias gradient is not fused, the column sum's.
  void impl_gemm(const GemmArgs& args) override {
    if (args.epilogue == GemmEpilogue::dgelu && args.bias_gradient.defined()) {
      // The DGELU GEMM that sums the up projection's bias gradient: its partials (the GEMM's
      // 16-bit epilogue applies here, so nothing runs apart).
      watch("dgelu_bias_gradient", pb::dgelu_bias_gradient(args.out), [&] { DryrunBackend::impl_gemm(args); });
      return;
    }
    if (args.role != GemmRole::backward_weight || args.a.is_quantized() || has_separable_epilogue(args) ||
        args.epilogue == GemmEpilogue::dgelu) {
      DryrunBackend::impl_gemm(args);
      return;
    }
    const Tensor &dout = args.a.tensor, &x = args.b.tensor;
    pb::PrivateBuffers expected =
        pb::linear_backward_weight(dout, x, args.out, args.bias_gradient, cuda_model().bias_gradient_fused);
    if (args.bias_gradient.defined() && !cuda_model().bias_gradient_fused && x.rows() > 0)
      for (const pb::PrivateBuffer& buffer : pb::column_sum(dout)) expected.push_back(buffer);
    watch("linear_backward_weight", expected, [&] { DryrunBackend::impl_gemm(args); });
  }
  void impl_rope(const Tensor& qkv, const AttentionShape& shape, const RopeSpec& rope, bool inverse,
                 const Tensor& out_amax) override {
    pb::PrivateBuffers expected;
    if (ropes_.insert(std::make_tuple(shape.seq, shape.head_dim, rope)).second)
      expected.push_back(pb::rope_table(shape.seq, shape.head_dim));
    watch("rope", expected, [&] { DryrunBackend::impl_rope(qkv, shape, rope, inverse, out_amax); });
  }
  void impl_attention_forward(const Tensor& qkv, const Tensor& out, const Tensor& lse,
                              const AttentionShape& shape) override {
    pb::PrivateBuffers expected = pb::attention_forward(qkv, out);
    add_workspace(expected, shape, qkv.dtype, false);
    watch("attention_forward", expected, [&] { DryrunBackend::impl_attention_forward(qkv, out, lse, shape); });
  }
  void impl_attention_backward(const Tensor& dout, const Tensor& qkv, const Tensor& out, const Tensor& lse,
                               const Tensor& dqkv, const AttentionShape& shape) override {
    pb::PrivateBuffers expected = pb::attention_backward(dout, qkv, out, dqkv);
    add_workspace(expected, shape, qkv.dtype, true);
    watch("attention_backward", expected,
          [&] { DryrunBackend::impl_attention_backward(dout, qkv, out, lse, dqkv, shape); });
  }

 private:
  void add_workspace(pb::PrivateBuffers& expected, const AttentionShape& shape, DType dtype, bool backward) {
    const DType io = dtype == DType::f32 ? DType::bf16 : dtype;
    if (auto grown = pb::attention_workspace(workspace_held_, cuda_model().attention_workspace_bytes(shape, io, backward))) {
      expected.push_back(*grown);
      workspace_held_ = grown->bytes();
    }
  }
  int depth_ = 0;
  std::set<std::tuple<int64_t, int64_t, RopeSpec>> ropes_;
  size_t workspace_held_ = 0;
};

struct DryrunCase {
  const char* family;
  const char* precision;
  const char* recompute;
  int64_t micro, accumulation;
  double grad_clip;
  bool quack_gelu = false;  // CudaAllocationModel::gemm_dgelu_bias_fused
};

std::string case_name(const ::testing::TestParamInfo<DryrunCase>& info) {
  const DryrunCase& c = info.param;
  return std::string(c.family) + "_" + c.precision + "_" + c.recompute + "_" + std::to_string(c.micro) + "x" +
         std::to_string(c.accumulation) + (c.grad_clip > 0 ? "_clip" : "_noclip") + (c.quack_gelu ? "_quack_gelu" : "");
}

class PrivateBuffersDryrun : public ::testing::TestWithParam<DryrunCase> {};

TEST_P(PrivateBuffersDryrun, EveryOpRecordsTheDescription) {
  const DryrunCase& c = GetParam();
  RunConfig config = small_run(c.family, c.recompute, c.micro, 64, c.micro * c.accumulation);
  config.train.precision = c.precision;
  config.optimizer.grad_clip = c.grad_clip;
  CudaAllocationModel model = Calibration::load().for_gpu(require_gpu("h200")).cuda_allocations;
  ASSERT_TRUE(model.enabled);
  model.gemm_dgelu_bias_fused = c.quack_gelu;
  WatchedDryrun backend(model);
  // Created with the backend: its two workspaces, nothing else.
  const std::vector<CachingAllocator::LiveEntry> created = backend.allocator().live_entries();
  ASSERT_EQ(created.size(), 2u);
  for (const pb::PrivateBuffer& buffer : pb::backend_workspaces()) {
    bool found = false;
    for (const auto& entry : created)
      found |= entry.name == buffer.name && entry.bytes == CachingAllocator::round_size(buffer.bytes());
    EXPECT_TRUE(found) << buffer.name;
  }
  {
    const PrecisionPlan precision = resolve_precision(config, backend);
    TrainingSession session(config, backend, precision, make_parameter_store(backend, config, precision, nullptr, 1));
    const std::vector<TokenBatch> batches(static_cast<size_t>(c.accumulation),
                                          TokenBatch{nullptr, nullptr, c.micro, config.train.seq_len});
    for (int step = 1; step <= 2; ++step)
      session.step(batches, c.micro * c.accumulation * config.train.seq_len, config.optimizer.lr, step);
  }
  // Every op family that allocates privately in this config was checked at least once.
  std::vector<std::string> expected_ops = {"norm_backward", "embedding_backward", "attention_forward",
                                           "attention_backward"};
  if (std::string(c.family) == "llama") expected_ops.push_back("rope");
  // GPT-2: the qkv bias gradient's column sums of dq; the up projection's bias gradient in the
  // DGELU GEMM where that is one kernel (BF16 only), else column sums after its weight GEMM.
  const bool dgelu_bias = c.quack_gelu && std::string(c.precision) == "bf16";
  if (std::string(c.family) == "gpt2") {
    expected_ops.push_back("qkv_bias_gradient");
    expected_ops.push_back(dgelu_bias ? "dgelu_bias_gradient" : "linear_backward_weight");
  }
  EXPECT_EQ(backend.checked.count("dgelu_bias_gradient") > 0, dgelu_bias);
  if (c.grad_clip <= 0) expected_ops.push_back("adamw");  // the norm rides on AdamW
  for (const std::string& op : expected_ops) EXPECT_GT(backend.checked[op], 0) << op << " was never checked";
  // And nothing outside those ops allocated under a private buffer's name.
  size_t private_allocations = 0;
  for (const Event& event : backend.events) private_allocations += !event.is_free && private_name(event.name);
  EXPECT_GT(private_allocations, 0u);
  EXPECT_EQ(private_allocations, backend.watched_private);
}

INSTANTIATE_TEST_SUITE_P(
    Configs, PrivateBuffersDryrun,
    ::testing::Values(DryrunCase{"llama", "bf16", "none", 2, 1, 1.0}, DryrunCase{"llama", "fp32", "full", 2, 2, 0.0},
                      DryrunCase{"gpt2", "bf16", "selective", 2, 1, 0.0}, DryrunCase{"gpt2", "fp32", "none", 1, 2, 1.0},
                      DryrunCase{"gpt2", "bf16", "none", 2, 2, 0.0, true},
                      DryrunCase{"gpt2", "fp32", "none", 1, 1, 0.0, true}),
    case_name);

}  // namespace
}  // namespace mxtrain::test
