// The decoder-only transformer, written once as block diagrams over Backend ops. Both families
// (llama, gpt2) share one block with family switches at the norm and MLP activation. Each
// block's saved activations live in Buffers whose scopes are the recompute policy: what a
// block keeps is decided in one place (keeps_*), and backward recomputes whatever was dropped.
#pragma once
#include <vector>

#include "mxtrain/backend/backend.hpp"
#include "mxtrain/model/config.hpp"
#include "mxtrain/model/linear_recipe.hpp"
#include "mxtrain/model/parameters.hpp"
#include "mxtrain/model/recompute.hpp"

namespace mxtrain {

// Rows of logits the loss computes at once: `asked` (train.logits_chunk_tokens) when positive;
// 0 = auto: the most rows, a multiple of 256 from 256 to 8192, whose logits take at most 1 GiB
// (a 128k vocabulary in bf16: 4096 rows; 32k or 50k: 8192). Never more than `rows`. Each chunk
// after the first adds a read and write of the head's weight gradient (its GEMM accumulates).
int64_t logits_chunk_rows(int64_t padded_vocab, DType dtype, int64_t asked, int64_t rows);

struct TransformerOptions {
  DType activation_dtype = DType::f32;
  RecomputePolicy recompute;
  int64_t logits_chunk_tokens = 0;  // rows of logits alive at once in the loss; 0 = auto (logits_chunk_rows)
  LinearRecipeOptions linear;          // how the blocks' linear GEMMs run (high precision by default)
  // Bit-identical gradients under every recompute policy (train.deterministic, with the
  // deterministic attention backward): GELU then stays a kernel of its own in forward
  // (layer_forward says why).
  bool deterministic = false;
};

// The keys and values of the tokens a generation has run so far, one pair per block:
// [capacity, kv_heads * head_dim] each, in the activation dtype; rows [0, length) are filled.
struct KvCache {
  std::vector<Buffer> keys, values;
  int64_t capacity = 0, length = 0;
};

class Transformer {
 public:
  Transformer(const ModelConfig& config, const TransformerOptions& options, Backend& backend, ParameterStore& params);

  // One micro-batch: tokens and targets i32 [batch*seq]. Gradients accumulate in the store,
  // scaled by grad_scale (1 / tokens in the global batch); loss_sum f32[1] += sum of the
  // per-token losses.
  void forward_backward(const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq, float grad_scale,
                        const Tensor& loss_sum);
  // Evaluation: loss_sum += sum of per-token losses; keeps one block's activations at a time.
  void forward_loss(const Tensor& tokens, const Tensor& targets, int64_t batch, int64_t seq,
                    const Tensor& loss_sum);
  // Inference: the logits of rows [first_row, batch*seq) into out [batch*seq - first_row,
  // padded_vocab] (activation dtype): generation reads the last row, tests every row.
  void forward_logits(const Tensor& tokens, int64_t batch, int64_t seq, int64_t first_row, const Tensor& out);
  // Generation with a key/value cache: an empty cache of `capacity` tokens (Lifetime::activation).
  KvCache make_kv_cache(int64_t capacity);
  // Runs the new tokens i32 [n] at positions [cache.length, cache.length + n) against the
  // cache, adds their keys and values to it, and writes the last token's logits into out
  // [1, padded_vocab]: the same row forward_logits gives for the whole sequence, to rounding.
  void forward_cached(const Tensor& tokens, KvCache& cache, const Tensor& out);

  const ModelConfig& config() const { return config_; }
  const TransformerOptions& options() const { return options_; }
  // The blocks' linear GEMMs and their scaling state; the trainer calls finish_step() after
  // each optimizer step.
  LinearRecipe& linears() { return linears_; }
  // Error(unsupported) when the precision recipe cannot run micro-batches of `rows` tokens.
  void check_batch(int64_t rows) const;

 private:
  // Activations of one block. Which of them survive the forward is the recompute policy.
  struct Saved {
    Buffer norm1, mean1, rstd1;  // attention-norm output and statistics
    Buffer qkv;                  // after RoPE
    Buffer attn, lse;            // attention output, log-sum-exp rows
    Buffer mid;                  // residual after attention
    Buffer norm2, mean2, rstd2;  // MLP-norm output and statistics
    Buffer up;                   // gate/up pairs interleaved (SwiGLU) or pre-GELU
    Buffer act;                  // MLP activation, input of the down projection
  };
  enum class Keep { all, selective, input_only };
  static Keep keep_for(RecomputeMode mode);

  Buffer activation(const char* what, int64_t layer, int64_t cols, Lifetime lifetime);
  // An activation's shape and dtype without storage: the operand of a cast that computes it from
  // its producer (LinearGemmOptions::producer / input_producer).
  Tensor produced(int64_t cols) const;
  // The cast producer of block l's attention or MLP norm of `input`, with the statistics s
  // holds (LinearRecipe::fuses_producers).
  enum class BlockNorm : uint8_t { attention, mlp };
  CastProducer norm_producer(int64_t l, BlockNorm which, const Tensor& input, const Saved& s);
  // Whether backward's recompute of a norm output (undefined `normed`) runs inside its
  // consumer's weight-gradient input cast instead, from the kept statistics.
  bool fuses_recomputed_norm(int64_t l, const Tensor& normed, LinearKind consumer, const Tensor& rstd) const;
  Buffer statistics(const char* what, int64_t layer);
  AttentionShape attention_shape() const;

  void embed_forward(const Tensor& tokens, const Tensor& x0);
  // Embedding and every block without keeping anything for backward: the last block's output.
  // With cache_ set, the tokens are the next ones of the cached sequence (batch 1).
  Buffer forward_blocks(const Tensor& tokens, int64_t batch, int64_t seq);
  // The final norm of x and the logits of its rows [first_row, rows) into out.
  void head_logits(const Tensor& x, int64_t first_row, const Tensor& out);
  void embed_backward(const Tensor& tokens, const Tensor& dres);
  // Runs block `layer` on x. Writes x_out unless it is undefined (recompute stops after the
  // MLP activation, which is all backward needs).
  void layer_forward(int64_t layer, const Tensor& x, const Tensor& x_out, Saved& saved, Keep keep);
  // dres holds d loss / d output of the block on entry and d loss / d input on return.
  void layer_backward(int64_t layer, const Tensor& x, Saved& saved, const Tensor& dres, RecomputeMode mode);
  // Final norm, logits in row chunks, cross-entropy; with dres defined also the backward of
  // all three (dres = d loss / d final hidden state).
  void head(const Tensor& x_final, const Tensor& targets, float grad_scale, const Tensor& loss_sum,
            const Tensor& dres);

  Tensor w(int64_t layer, int index);   // a block parameter, or an undefined tensor for index -1
  // The gradients of a weight and its bias (bias index -1: none) in `group`, which one op writes
  // together: a single flag says whether it adds to them or overwrites (their first write).
  struct GradPair {
    Tensor weight, bias;
    bool accumulate = true;
  };
  GradPair grads(int group, int weight, int bias);
  GradPair dw(int64_t layer, int weight, int bias) { return grads(layout_.layer_group(layer), weight, bias); }
  NormKind norm_kind() const { return config_.family == ModelFamily::llama ? NormKind::rms : NormKind::layer; }

  ModelConfig config_;
  TransformerOptions options_;
  Backend& backend_;
  ParameterStore& params_;
  const ModelLayout& layout_;
  LinearRecipe linears_;
  int64_t batch_ = 0, seq_ = 0, rows_ = 0;
  KvCache* cache_ = nullptr;  // set during forward_cached only
};

}  // namespace mxtrain
