// train.attention_backward = flash-attention-4 where no GPU is needed: FlashAttention-4's
// workspace formula (the buffers flash_attn/cute/interface.py allocates for the sm_90 causal
// backward, rounded to its tiles), the shapes it refuses, the config's refusals, and the
// planner pricing the setting: its workspace in place of cuDNN's, its faster backward at the
// measured ratios (1.244x at head dimension 64, 1.066x at 128: the calibration's gain and
// head_dim_half reproduce them), and a cpu run that names the setting as cuda-only.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "mxtrain/backend/dryrun/dryrun_backend.hpp"
#include "mxtrain/backend/private_buffers.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/plan/calibration.hpp"
#include "mxtrain/plan/cost_model.hpp"
#include "support/test_support.hpp"

namespace mxtrain {
namespace {

namespace pb = private_buffers;

AttentionShape shape_of(int64_t batch, int64_t seq, int64_t heads, int64_t kv_heads, int64_t head_dim) {
  AttentionShape shape;
  shape.batch = batch;
  shape.seq = seq;
  shape.heads = heads;
  shape.kv_heads = kv_heads;
  shape.head_dim = head_dim;
  return shape;
}

TEST(FlashAttention4Workspace, LlamaOneBAtItsBenchmarkShape) {
  // 8 x 2048, 32 query heads on 8 KV heads, head dimension 64: tiles 128 x 128, nothing to round.
  const pb::FlashAttention4Workspace w = pb::flash_attention_4_workspace(shape_of(8, 2048, 32, 8, 64));
  EXPECT_EQ(w.query_tile, 128);
  EXPECT_EQ(w.key_tile, 128);
  EXPECT_EQ(w.dq_accum_bytes, int64_t{4} * 8 * 32 * 2048 * 64);
  EXPECT_EQ(w.row_bytes, int64_t{4} * 8 * 32 * 2048);
  EXPECT_EQ(w.dkv_accum_bytes, int64_t{4} * 8 * 8 * 2048 * 64);
  EXPECT_EQ(w.bytes(), w.dq_accum_bytes + 2 * w.row_bytes + 2 * w.dkv_accum_bytes);
  EXPECT_EQ(w.dv_accum_offset(), w.dk_accum_offset() + w.dkv_accum_bytes);
}

TEST(FlashAttention4Workspace, RowsRoundToTheTilesAndMultiHeadNeedsNoKvAccumulators) {
  // Head dimension 128: 64-row query tiles, 128-row key tiles; 328 rows round to 384 both ways.
  const pb::FlashAttention4Workspace w = pb::flash_attention_4_workspace(shape_of(1, 328, 6, 2, 128));
  EXPECT_EQ(w.query_tile, 64);
  EXPECT_EQ(w.seq_q_rounded, 384);
  EXPECT_EQ(w.seq_k_rounded, 384);
  EXPECT_EQ(w.dq_accum_bytes, int64_t{4} * 6 * 384 * 128);
  EXPECT_EQ(w.dkv_accum_bytes, int64_t{4} * 2 * 384 * 128);
  // 200 rows at head dimension 40: 256 rows, the head dimension rounded to 64; every buffer
  // starts at a 256-byte boundary.
  const pb::FlashAttention4Workspace odd = pb::flash_attention_4_workspace(shape_of(1, 200, 3, 3, 40));
  EXPECT_EQ(odd.seq_q_rounded, 256);
  EXPECT_EQ(odd.rounded_head_dim, 64);
  EXPECT_EQ(odd.dkv_accum_bytes, 0);
  EXPECT_EQ(odd.row_bytes, 3 * 1024);  // 4 * 3 * 256
  EXPECT_EQ(odd.dpsum_offset() % 256, 0);
  EXPECT_EQ(odd.lse_log2_offset() % 256, 0);
}

TEST(FlashAttention4Workspace, ShapesItCannotRunSayWhy) {
  EXPECT_EQ(pb::flash_attention_4_unsupported(shape_of(8, 2048, 32, 8, 64), DType::bf16), "");
  EXPECT_EQ(pb::flash_attention_4_unsupported(shape_of(8, 2048, 32, 8, 64), DType::f32), "");  // staged as bf16
  EXPECT_NE(pb::flash_attention_4_unsupported(shape_of(8, 2048, 32, 8, 64), DType::f16).find("bf16"),
            std::string::npos);
  EXPECT_NE(pb::flash_attention_4_unsupported(shape_of(8, 128, 32, 8, 64), DType::bf16).find("more than 128"),
            std::string::npos);
  EXPECT_NE(pb::flash_attention_4_unsupported(shape_of(8, 2048, 16, 16, 256), DType::bf16).find("8..128"),
            std::string::npos);
  EXPECT_NE(pb::flash_attention_4_unsupported(shape_of(8, 2048, 16, 16, 60), DType::bf16).find("8..128"),
            std::string::npos);
}

RunConfig load(std::vector<std::pair<std::string, std::string>> overrides) {
  ConfigSources sources;
  sources.read_environment = false;
  sources.overrides = std::move(overrides);
  return load_config(sources);
}

std::string config_error(std::vector<std::pair<std::string, std::string>> overrides) {
  try {
    load(std::move(overrides));
  } catch (const Error& error) {
    EXPECT_EQ(error.kind(), ErrorKind::config);
    return error.full_message();
  }
  return "";
}

TEST(FlashAttention4Config, RefusedWhereItCannotRun) {
  EXPECT_EQ(load({{"train.attention_backward", "flash-attention-4"}}).train.attention_backward, "flash-attention-4");
  EXPECT_NE(config_error({{"train.attention_backward", "flash-attention-4"}, {"train.deterministic", "true"}})
                .find("not bit-reproducible"),
            std::string::npos);
  EXPECT_NE(config_error({{"train.attention_backward", "flash-attention-4"}, {"train.precision", "fp16"}}).find("bf16"),
            std::string::npos);
  EXPECT_NE(config_error({{"train.attention_backward", "flash-attention-4"}, {"train.seq_len", "128"}})
                .find("more than 128 tokens"),
            std::string::npos);
  EXPECT_NE(config_error({{"train.attention_backward", "flash-attention-3"}}).find("cudnn, flash-attention-4"),
            std::string::npos);
}

TEST(FlashAttention4Plan, DryrunHoldsItsWorkspaceInPlaceOfCudnns) {
  CudaAllocationModel model;
  model.enabled = true;
  model.attention_backward_engine_bytes = 512;
  const AttentionShape shape = shape_of(8, 2048, 32, 8, 64);
  const int64_t cudnn = model.attention_workspace_bytes(shape, DType::bf16, true);
  model.flash_attention_4_backward = true;
  EXPECT_EQ(model.attention_workspace_bytes(shape, DType::bf16, true), pb::flash_attention_4_workspace(shape).bytes());
  EXPECT_LT(model.attention_workspace_bytes(shape, DType::bf16, true), cudnn);  // no per-query-head dK/dV
  EXPECT_EQ(model.attention_workspace_bytes(shape, DType::bf16, false), model.attention_forward_workspace_bytes);
  DryrunBackend dryrun(0, "h200", model);
  EXPECT_THROW(dryrun.check_attention_backward(shape_of(8, 64, 32, 8, 64), DType::bf16), Error);
  dryrun.check_attention_backward(shape, DType::bf16);
}

TEST(FlashAttention4Plan, BackwardPricedAtTheMeasuredRatios) {
  const GpuSpec& h200 = require_gpu("h200");
  const GpuCalibration c = Calibration::load().for_gpu(h200);
  auto ratio = [&](int64_t head_dim) {
    OpRecord op{OpKind::attention_backward, Phase::backward, DType::bf16, 1e13, 1e6};
    op.n = 2048;
    op.k = head_dim;
    return (op_seconds(op, h200, c, false, false) - c.launch_overhead_s * gpu_launches(op.kind)) /
           (op_seconds(op, h200, c, false, true) - c.launch_overhead_s * gpu_launches(op.kind));
  };
  EXPECT_NEAR(ratio(64), 1.244, 0.005);
  EXPECT_NEAR(ratio(128), 1.066, 0.005);
  OpRecord forward{OpKind::attention_forward, Phase::forward, DType::bf16, 1e13, 1e6};
  forward.n = 2048;
  forward.k = 64;
  EXPECT_EQ(op_seconds(forward, h200, c, false, true), op_seconds(forward, h200, c, false, false));  // cuDNN's
}

TEST(FlashAttention4Plan, PlanCommandPricesTheSetting) {
  auto plan = [](const std::string& backward) {
    std::string output;
    EXPECT_EQ(test::run_command(test::binary_path() + " plan -m llama-1b -b 8 -s 2048 -p fp8 --gpu h200 --json "
                                                      "--set train.attention_backward=" +
                                    backward + " 2>/dev/null",
                                &output),
              0)
        << output;
    return nlohmann::json::parse(output);
  };
  const nlohmann::json cudnn = plan("cudnn"), fa4 = plan("flash-attention-4");
  EXPECT_LT(fa4["time"]["attention_s"].get<double>(), cudnn["time"]["attention_s"].get<double>());
  EXPECT_EQ(fa4["time"]["gemm_s"].get<double>(), cudnn["time"]["gemm_s"].get<double>());
  EXPECT_LT(fa4["memory"]["peak_live_bytes"].get<int64_t>(), cudnn["memory"]["peak_live_bytes"].get<int64_t>());
  // Its kernels are Hopper's: planning it for a Blackwell GPU is refused with the fix.
  std::string output;
  EXPECT_NE(test::run_command(test::binary_path() + " plan -m llama-1b -b 8 -s 2048 --gpu b200 "
                                                    "--set train.attention_backward=flash-attention-4 2>&1",
                              &output),
            0);
  EXPECT_NE(output.find("Hopper (sm_90a) only"), std::string::npos) << output;
  EXPECT_NE(output.find("train.attention_backward = cudnn"), std::string::npos) << output;
}

TEST(FlashAttention4Plan, CpuRunNamesItACudaSetting) {
  std::string output;
  test::TempDir dir;
  EXPECT_NE(test::run_command(test::binary_path() + " train -d cpu -m tiny -b 2 -s 160 --steps 1 -o " + dir.file("run") +
                                  " --set train.attention_backward=flash-attention-4 2>&1",
                              &output),
            0);
  EXPECT_NE(output.find("is a cuda setting"), std::string::npos) << output;
}

}  // namespace
}  // namespace mxtrain
