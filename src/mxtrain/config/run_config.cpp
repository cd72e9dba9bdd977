#include "mxtrain/config/run_config.hpp"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <limits>

#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/model/recompute.hpp"

namespace mxtrain {
namespace {

// Upper bounds of the size keys: well above every model and run of the field (the largest
// vocabularies are ~256k, hidden sizes ~16k, layer counts ~128, contexts ~1M tokens), and low
// enough that no product of them overflows 64-bit size arithmetic before the memory check
// (docs/config-reference.md, docs/reliability.md).
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxVocab = int64_t{1} << 24;
constexpr int64_t kMaxHidden = int64_t{1} << 17;
constexpr int64_t kMaxHeads = 4096;
constexpr int64_t kMaxFfn = int64_t{1} << 20;
constexpr int64_t kMaxSequence = int64_t{1} << 22;
constexpr int64_t kMaxMicroBatch = int64_t{1} << 16;
constexpr int64_t kMaxGlobalBatch = int64_t{1} << 24;
constexpr int64_t kMaxSteps = int64_t{1} << 40;  // counts of steps: no memory depends on them
constexpr int64_t kMaxSeed = std::numeric_limits<int64_t>::max();

[[noreturn]] void bad_value(const std::string& key, const std::string& text, const std::string& expected) {
  throw Error(ErrorKind::config, "bad value '" + text + "' for " + key, key + " expects " + expected);
}

std::string join(const std::vector<std::string>& items) {
  std::string text;
  for (const std::string& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

// Every integer key has an upper bound: sizes beyond it would only end in an allocation the
// machine cannot make or in arithmetic that overflows (docs/config-reference.md).
Field integer(const std::string& key, int64_t& value, const std::string& help, int64_t minimum, int64_t maximum) {
  const std::string range = log::integer_with_commas(minimum) + " to " + log::integer_with_commas(maximum);
  return Field{key, FieldType::integer, help, {}, [&value] { return std::to_string(value); },
               [&value, key, range, minimum, maximum](const std::string& text) {
                 errno = 0;
                 char* end = nullptr;
                 long long parsed = std::strtoll(text.c_str(), &end, 10);
                 if (text.empty() || *end != '\0' || errno != 0 || parsed < minimum || parsed > maximum)
                   bad_value(key, text, "an integer from " + range);
                 value = parsed;
               },
               range};
}

std::string real_text(double value) {
  std::string text = strf("%.10g", value);
  if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
  return text;
}

template <typename T>
Field real(const std::string& key, T& value, const std::string& help, double minimum, double maximum) {
  const std::string range = strf("%g to %g", minimum, maximum);
  return Field{key, FieldType::real, help, {}, [&value] { return real_text(static_cast<double>(value)); },
               [&value, key, range, minimum, maximum](const std::string& text) {
                 errno = 0;
                 char* end = nullptr;
                 double parsed = std::strtod(text.c_str(), &end);
                 if (text.empty() || *end != '\0' || errno != 0 || !std::isfinite(parsed) || parsed < minimum ||
                     parsed > maximum)
                   bad_value(key, text, "a number from " + range);
                 value = static_cast<T>(parsed);
               },
               range};
}

Field boolean(const std::string& key, bool& value, const std::string& help) {
  return Field{key, FieldType::boolean, help, {}, [&value] { return std::string(value ? "true" : "false"); },
               [&value, key](const std::string& text) {
                 // SageMaker passes Python's True/False; shells pass 1/0.
                 if (text == "true" || text == "True" || text == "1") value = true;
                 else if (text == "false" || text == "False" || text == "0") value = false;
                 else bad_value(key, text, "true or false");
               }, ""};
}

Field text(const std::string& key, std::string& value, const std::string& help) {
  return Field{key, FieldType::text, help, {}, [&value] { return value; },
               [&value](const std::string& input) { value = input; }, ""};
}

Field choice(const std::string& key, std::string& value, const std::string& help, std::vector<std::string> choices) {
  return Field{key, FieldType::choice, help, choices, [&value] { return value; },
               [&value, key, choices](const std::string& input) {
                 for (const std::string& allowed : choices)
                   if (input == allowed) {
                     value = input;
                     return;
                   }
                 bad_value(key, input, "one of: " + join(choices));
               }, ""};
}

// "auto", or a boolean in any of the forms boolean() takes, stored as auto, true or false.
Field boolean_or_auto(const std::string& key, std::string& value, const std::string& help) {
  return Field{key, FieldType::text, help, {}, [&value] { return value; },
               [&value, key](const std::string& text) {
                 if (text == "auto") value = "auto";
                 else if (text == "true" || text == "True" || text == "1") value = "true";
                 else if (text == "false" || text == "False" || text == "0") value = "false";
                 else bad_value(key, text, "auto, true or false");
               },
               "auto, true, false"};
}

// "auto" or a block count.
Field count_or_auto(const std::string& key, std::string& value, const std::string& help) {
  const std::string range = "auto, or 0 to " + log::integer_with_commas(kMaxLayers);
  return Field{key, FieldType::text, help, {}, [&value] { return value; },
               [&value, key, range](const std::string& input) {
                 char* end = nullptr;
                 errno = 0;
                 const long long parsed = std::strtoll(input.c_str(), &end, 10);
                 if (input != "auto" &&
                     (input.empty() || *end != '\0' || errno != 0 || parsed < 0 || parsed > kMaxLayers))
                   bad_value(key, input, range);
                 value = input == "auto" ? input : std::to_string(parsed);
               },
               range};
}

}  // namespace

std::vector<Field> fields(RunConfig& c) {
  ModelConfig& m = c.model;
  std::vector<Field> list;
  list.push_back(Field{"model.preset", FieldType::choice, "model shape preset; setting it resets every model.* key",
                       model_preset_names(), [&m] { return m.preset; },
                       [&m](const std::string& name) { m = model_preset(name); }, ""});
  list.push_back(Field{"model.family", FieldType::choice, "llama (RMSNorm, RoPE, SwiGLU, GQA) or gpt2", {"llama", "gpt2"},
                       [&m] { return std::string(family_name(m.family)); },
                       [&m](const std::string& name) {
                         if (name != "llama" && name != "gpt2") bad_value("model.family", name, "llama or gpt2");
                         m.family = name == "llama" ? ModelFamily::llama : ModelFamily::gpt2;
                       }, ""});
  list.push_back(integer("model.vocab_size", m.vocab_size, "tokens the tokenizer produces", 1, kMaxVocab));
  list.push_back(integer("model.padded_vocab", m.padded_vocab, "rows of embedding and head (>= vocab_size); when only vocab_size is set, vocab_size rounded up to 64", 1, kMaxVocab));
  list.push_back(integer("model.hidden", m.hidden, "hidden size", 1, kMaxHidden));
  list.push_back(integer("model.layers", m.layers, "transformer blocks", 1, kMaxLayers));
  list.push_back(integer("model.heads", m.heads, "attention heads", 1, kMaxHeads));
  list.push_back(integer("model.kv_heads", m.kv_heads, "key/value heads (grouped-query attention)", 1, kMaxHeads));
  list.push_back(integer("model.ffn_hidden", m.ffn_hidden, "MLP inner size", 1, kMaxFfn));
  list.push_back(integer("model.max_seq_len", m.max_seq_len, "learned position table size (gpt2)", 1, kMaxSequence));
  list.push_back(integer("model.sliding_window", m.sliding_window,
                         "a Mistral checkpoint's sliding attention window (0 = none; set from model.init_from's "
                         "config.json): attention is full causal, the window's exactly while train.seq_len <= it, "
                         "so a longer train.seq_len is refused",
                         0, kMaxSequence));
  list.push_back(real("model.norm_eps", m.norm_eps, "norm epsilon", 0, 1));
  list.push_back(real("model.rope_theta", m.rope_theta, "RoPE base", 1, 1e12));
  list.push_back(real("model.rope_scaling_factor", m.rope_scaling_factor,
                      "Llama 3 RoPE frequency scaling factor (0 = none)", 0, 1e6));
  list.push_back(real("model.rope_low_freq_factor", m.rope_low_freq_factor, "Llama 3 scaling: low_freq_factor", 0, 1e6));
  list.push_back(real("model.rope_high_freq_factor", m.rope_high_freq_factor, "Llama 3 scaling: high_freq_factor", 0,
                      1e6));
  list.push_back(integer("model.rope_original_max_positions", m.rope_original_max_positions,
                         "Llama 3 scaling: original_max_position_embeddings", 0, kMaxSequence));
  list.push_back(real("model.init_std", m.init_std, "std of the normal initialisation", 0, 10));
  list.push_back(boolean("model.tied_embeddings", m.tied_embeddings, "head shares the token embedding"));
  list.push_back(boolean("model.bias", m.bias, "biases in every linear layer (GPT-2; a Llama with attention_bias and "
                                              "mlp_bias)"));
  list.push_back(boolean("model.qkv_bias", m.qkv_bias,
                         "biases on the query, key and value projections only (Qwen2; implied by model.bias)"));
  list.push_back(text("model.init_from", m.init_from,
                      "Hugging Face model directory to start from: its config.json sets model.*, its safetensors the "
                      "weights (\"\" = random initialisation)"));

  list.push_back(text("data.train", c.data.train, "glob of training shards"));
  list.push_back(text("data.val", c.data.val, "glob of validation shards (\"\" = no held-out loss)"));
  list.push_back(text("data.tokenizer", c.data.tokenizer,
                      "tokenizer of the shards: byte, or the tokenizer.json, sentencepiece .model or model directory "
                      "prepare used (export copies its files beside the model; checked at start-up against the shards' "
                      "meta.json)"));

  list.push_back(choice("train.device", c.train.device, "where to train", {"auto", "cpu", "cuda"}));
  list.push_back(choice("train.precision", c.train.precision,
                        "number format of compute: fp8 = per-tensor FP8 with delayed scaling, fp8-current = with "
                        "current scaling, mxfp8 and nvfp4 = block-scaled (docs/precision.md)",
                        {"auto", "fp32", "bf16", "fp16", "fp8", "fp8-current", "mxfp8", "nvfp4"}));
  list.push_back(Field{"train.recompute", FieldType::text, "activation checkpointing: none, selective, full or K", {},
                       [&c] { return c.train.recompute; },
                       [&c](const std::string& input) { c.train.recompute = RecomputePolicy::parse(input).str(); }, ""});
  list.push_back(integer("train.steps", c.train.steps, "optimizer steps", 1, kMaxSteps));
  list.push_back(integer("train.micro_batch_size", c.train.micro_batch_size, "sequences per micro-batch per rank", 1, kMaxMicroBatch));
  list.push_back(integer("train.global_batch_size", c.train.global_batch_size,
                         "sequences per optimizer step (0 = micro_batch_size x ranks)", 0, kMaxGlobalBatch));
  list.push_back(integer("train.seq_len", c.train.seq_len, "tokens per sequence", 2, kMaxSequence));
  list.push_back(integer("train.seed", c.train.seed, "seed of initialisation and data order", 0, kMaxSeed));
  list.push_back(integer("train.threads", c.train.threads, "CPU threads (0 = all cores)", 0, 4096));
  list.push_back(integer("train.logits_chunk_tokens", c.train.logits_chunk_tokens,
                         "rows of logits alive at once in the loss (0 = auto: at most 8192, and at most 1 GiB of "
                         "logits, in multiples of 256)",
                         0, int64_t{1} << 30));
  list.push_back(boolean("train.tf32", c.train.tf32, "TF32 tensor cores for fp32 precision on cuda"));
  list.push_back(boolean("train.deterministic", c.train.deterministic,
                         "bit-reproducible gradients on cuda: the deterministic attention backward, and GELU "
                         "as a kernel of its own (not on the GEMM's epilogue), so every recompute policy gives "
                         "the same bits"));
  list.push_back(choice("train.attention_backward", c.train.attention_backward,
                        "cuda: the attention backward: cudnn (cuDNN's SDPA graph) or flash-attention-4 "
                        "(FlashAttention-4's Hopper kernels after cuDNN's forward, about 1.25x faster at head "
                        "dimension 64 on an H200; bf16 activations, more than 128 tokens, not with "
                        "train.deterministic; a build with its kernels: docs/attention.md); auto takes "
                        "flash-attention-4 where all of that holds for the run (its kernels carried for the "
                        "model's head dimension and query heads per key/value head, a Hopper GPU), else cudnn",
                        {"auto", "cudnn", "flash-attention-4"}));
  list.push_back(boolean("train.gemm_autotune", c.train.gemm_autotune,
                         "cuda: time cuBLASLt's candidate algorithms for each GEMM shape once and keep the "
                         "fastest (false: the heuristic's first choice, the same in every run)"));
  list.push_back(choice("train.gemm_kernels", c.train.gemm_kernels,
                        "cuda: the GEMM libraries: cublaslt; cublaslt+quack-swiglu (llama's gate/up GEMM is "
                        "quack's gated GEMM with SwiGLU in its epilogue, on Hopper in BF16 where the activation is "
                        "kept and the run is not deterministic; every other GEMM cuBLASLt's); cublaslt+quack-gelu "
                        "(GPT-2's up GEMM with bias and GELU and the down projection's input gradient with GELU's "
                        "derivative are quack's, the latter also summing the up projection's bias gradient, on "
                        "Hopper in BF16 under the same conditions); or cublaslt+quack "
                        "(both, and with train.gemm_autotune quack's tile configurations timed beside cuBLASLt's "
                        "algorithms for every plain BF16 GEMM shape, measured no faster on the H200). quack's "
                        "kernels need a build that carries them: docs/gemm-kernels.md. auto takes "
                        "cublaslt+quack-swiglu for a llama and cublaslt+quack-gelu for a GPT-2 where the build "
                        "carries those kernels, the GPU is a Hopper and the run is not deterministic, else "
                        "cublaslt. With train.gemm_autotune, quack's GELU GEMMs run only at shapes where they time "
                        "faster than cuBLASLt's GELU epilogues",
                        {"auto", "cublaslt", "cublaslt+quack-swiglu", "cublaslt+quack-gelu", "cublaslt+quack"}));
  list.push_back(choice("train.head_loss", c.train.head_loss,
                        "cuda: the LM head and its loss: chunked (per chunk of rows the logits GEMM, the "
                        "cross-entropy kernel in place, the two gradient GEMMs) or quack-lce (quack's scaled-exp "
                        "linear cross-entropy: the logits GEMM stores exp(z - k) with a per-tile offset and the "
                        "tiles' sums, a small glue kernel, and the two gradient GEMMs scale it on the way in; no "
                        "pass over the logits of its own; BF16 on a Hopper GPU, a build that carries its kernels: "
                        "docs/gemm-kernels.md). auto takes chunked",
                        {"auto", "chunked", "quack-lce"}));
  list.push_back(boolean("train.cuda_graph", c.train.cuda_graph,
                         "cuda: capture the third step in a CUDA graph and replay it for the steps after (one "
                         "GPU; every precision but fp16's loss scaling and nvfp4 with stochastic rounding; not "
                         "train.nonfinite = skip); the same results as op by op"));
  list.push_back(choice("train.nonfinite", c.train.nonfinite,
                        "a NaN or Inf loss or gradient norm: stop (the run ends before anything non-finite is "
                        "saved; the last checkpoint stays) or skip (that step's update is dropped and counted)",
                        {"stop", "skip"}));
  list.push_back(integer("train.nonfinite_max_skips", c.train.nonfinite_max_skips,
                         "train.nonfinite = skip: the most non-finite steps in a row before the run stops", 1,
                         1000000));

  PrecisionConfig& p = c.precision;
  list.push_back(choice("precision.fp8_format", p.fp8_format,
                        "FP8 element formats: hybrid = E4M3 forward, E5M2 gradients; auto = hybrid for fp8, e4m3 for "
                        "mxfp8", {"auto", "hybrid", "e4m3"}));
  list.push_back(integer("precision.amax_history_len", p.amax_history_len, "fp8 delayed scaling: amax history steps", 1,
                         1 << 20));
  list.push_back(choice("precision.amax_compute_algo", p.amax_compute_algo,
                        "fp8 delayed scaling: max over the history or its most recent amax", {"max", "most_recent"}));
  list.push_back(integer("precision.margin", p.margin, "fp8 scaling margin: scale = fp8_max * 2^-margin / amax", -100,
                         100));
  list.push_back(count_or_auto("precision.bf16_first_layers", p.bf16_first_layers,
                               "first blocks whose linear layers stay in BF16 (auto = 0)"));
  list.push_back(count_or_auto("precision.bf16_last_layers", p.bf16_last_layers,
                               "last blocks whose linear layers stay in BF16 (auto = min(4, layers/4) for nvfp4, else 0)"));
  list.push_back(boolean_or_auto("precision.quantized_weights", p.quantized_weights,
                                 "keep no BF16 copy of the quantized blocks' weights (nor of an untied token table): "
                                 "their casts and lookups read the FP32 masters; auto = true for fp8, fp8-current, "
                                 "mxfp8 and nvfp4 on one process, false with FSDP"));
  list.push_back(choice("precision.grad_dtype", p.grad_dtype,
                        "gradients of the blocks' weights: auto = bf16 for --precision bf16, fp8 or fp8-current "
                        "with one micro-batch a step on one GPU (the GEMMs' output, as torch autocast leaves it), "
                        "else f32",
                        {"auto", "f32", "bf16"}));
  list.push_back(choice("precision.mx_scale_rounding", p.mx_scale_rounding,
                        "MXFP8 E8M0 scales: rceil (NVIDIA, TE, cuBLAS) or floor (OCP MX v1.0)", {"rceil", "floor"}));
  list.push_back(boolean("precision.nvfp4_rht", p.nvfp4_rht, "nvfp4: random Hadamard transform of the wgrad operands"));
  list.push_back(boolean("precision.nvfp4_stochastic_rounding", p.nvfp4_stochastic_rounding,
                         "nvfp4: stochastic rounding of gradients"));
  list.push_back(boolean("precision.nvfp4_2d_weights", p.nvfp4_2d_weights, "nvfp4: one scale per 16x16 weight tile"));
  list.push_back(boolean("precision.fp8_optimizer_weight_casts", p.fp8_optimizer_weight_casts,
                         "fp8 (delayed scaling) without sharded masters: the AdamW step writes each quantized "
                         "weight's FP8 copy for the next forward as it updates the weight, so the forward casts no "
                         "weight (false: the forward casts them; the same bits)"));
  list.push_back(real("precision.loss_scale_init", p.loss_scale_init, "fp16: initial dynamic loss scale", 1, 4294967296.0));
  list.push_back(integer("precision.loss_scale_growth_interval", p.loss_scale_growth_interval,
                         "fp16: steps without overflow before the loss scale grows", 1, kMaxSteps));
  list.push_back(real("precision.loss_scale_backoff", p.loss_scale_backoff, "fp16: loss scale factor on overflow",
                      1e-3, 0.999));
  list.push_back(real("precision.loss_scale_growth", p.loss_scale_growth, "fp16: loss scale growth factor", 1.001,
                      1000));

  list.push_back(real("optimizer.lr", c.optimizer.lr, "peak learning rate", 0, 10));
  list.push_back(real("optimizer.beta1", c.optimizer.beta1, "Adam beta1", 0, 1));
  list.push_back(real("optimizer.beta2", c.optimizer.beta2, "Adam beta2", 0, 1));
  list.push_back(real("optimizer.eps", c.optimizer.eps, "Adam epsilon", 0, 1));
  list.push_back(real("optimizer.weight_decay", c.optimizer.weight_decay, "decoupled weight decay (matrices only)", 0, 10));
  list.push_back(real("optimizer.grad_clip", c.optimizer.grad_clip, "max global gradient norm (0 = off)", 0, 1e6));

  list.push_back(integer("schedule.warmup_steps", c.schedule.warmup_steps, "linear warm-up steps", 0, kMaxSteps));
  list.push_back(choice("schedule.decay", c.schedule.decay, "decay after warm-up", {"cosine", "linear", "constant"}));
  list.push_back(real("schedule.min_lr_ratio", c.schedule.min_lr_ratio, "decay floor as a fraction of the peak", 0, 1));

  list.push_back(integer("eval.every", c.eval.every, "held-out loss every N steps (0 = only at the end)", 0, kMaxSteps));
  list.push_back(integer("eval.batches", c.eval.batches,
                         "validation micro-batches per evaluation (0 = no held-out evaluation)", 0, 1000000));

  list.push_back(integer("log.every", c.log.every, "a step line every N steps", 1, kMaxSteps));
  list.push_back(text("log.metrics", c.log.metrics, "JSONL metrics file in the run directory"));
  list.push_back(boolean("log.all_ranks", c.log.all_ranks, "step lines from every rank"));
  list.push_back(integer("log.sample_every", c.log.sample_every,
                         "print a generated sample every N steps (0 = never), from log.sample_prompt", 0, kMaxSteps));
  list.push_back(integer("log.sample_tokens", c.log.sample_tokens, "tokens in each sample", 1, kMaxSequence));
  list.push_back(text("log.sample_prompt", c.log.sample_prompt, "the text each sample continues"));
  list.push_back(boolean("log.tensorboard", c.log.tensorboard,
                         "TensorBoard event files in <run directory>/tensorboard: the metrics.jsonl points"));

  list.push_back(text("checkpoint.dir", c.checkpoint.dir, "run directory (\"\" = runs/<model.preset>)"));
  list.push_back(integer("checkpoint.every", c.checkpoint.every, "steps between checkpoints (0 = at the end only)", 0, kMaxSteps));
  list.push_back(real("checkpoint.every_minutes", c.checkpoint.every_minutes, "minutes between checkpoints (0 = off)", 0, 1e6));
  list.push_back(integer("checkpoint.keep", c.checkpoint.keep, "newest checkpoints kept", 1, 1000000));
  list.push_back(choice("checkpoint.resume", c.checkpoint.resume, "resume from the run directory's newest checkpoint",
                        {"auto", "always", "never"}));
  list.push_back(real("checkpoint.stop_deadline_s", c.checkpoint.stop_deadline_s,
                      "seconds to save and exit after SIGTERM/SIGINT", 1, 1e6));

  list.push_back(choice("dist.strategy", c.dist.strategy, "FSDP sharding strategy",
                        {"full_shard", "shard_grad_op", "no_shard", "hybrid_shard"}));
  list.push_back(choice("dist.backend", c.dist.backend, "collectives engine", {"auto", "nccl", "mpi"}));
  list.push_back(choice("dist.reduce_dtype", c.dist.reduce_dtype, "dtype of gradient reduction", {"f32", "bf16"}));
  list.push_back(integer("dist.shard_group_size", c.dist.shard_group_size,
                         "hybrid_shard: ranks per shard group (0 = ranks per node)", 0, 1 << 20));
  list.push_back(boolean("dist.sync_every_micro_batch", c.dist.sync_every_micro_batch,
                         "reduce gradients after every micro-batch (false: only the last)"));
  return list;
}

void validate(const RunConfig& c) {
  c.model.validate();
  RecomputePolicy policy = RecomputePolicy::parse(c.train.recompute);
  if (policy.full_layers > c.model.layers)
    throw Error(ErrorKind::config,
                strf("train.recompute = %lld but the model has %lld layers", static_cast<long long>(policy.full_layers),
                     static_cast<long long>(c.model.layers)),
                "use a layer count between 0 and model.layers, or full");
  if (c.model.family == ModelFamily::gpt2 && c.train.seq_len > c.model.max_seq_len)
    throw Error(ErrorKind::config,
                strf("train.seq_len = %lld exceeds model.max_seq_len = %lld (the learned position table)",
                     static_cast<long long>(c.train.seq_len), static_cast<long long>(c.model.max_seq_len)),
                "lower train.seq_len or raise model.max_seq_len");
  if (c.model.sliding_window > 0 && c.train.seq_len > c.model.sliding_window)
    throw Error(ErrorKind::config,
                strf("train.seq_len = %lld is longer than model.sliding_window = %lld: the model was trained with "
                     "sliding-window attention, which mxtrain's full causal attention reproduces only on sequences "
                     "of at most %lld tokens",
                     static_cast<long long>(c.train.seq_len), static_cast<long long>(c.model.sliding_window),
                     static_cast<long long>(c.model.sliding_window)),
                strf("set train.seq_len <= %lld (-s %lld)", static_cast<long long>(c.model.sliding_window),
                     static_cast<long long>(c.model.sliding_window)));
  const std::string& precision = c.train.precision;
  const bool quantized = precision == "fp8" || precision == "fp8-current" || precision == "mxfp8" || precision == "nvfp4";
  if (c.precision.quantized_weights == "true" && !quantized)
    throw Error(ErrorKind::config,
                "precision.quantized_weights = true but train.precision = " + precision +
                    " has no quantized weights to keep",
                "use it with train.precision fp8, fp8-current, mxfp8 or nvfp4, or set precision.quantized_weights = "
                "false");
  if (c.train.attention_backward == "flash-attention-4") {
    if (c.train.deterministic)
      throw Error(ErrorKind::config,
                  "train.attention_backward = flash-attention-4 with train.deterministic = true: FlashAttention-4's "
                  "backward sums dQ with atomics, so its gradients are not bit-reproducible",
                  "set train.attention_backward = cudnn (cuDNN's deterministic backward) or train.deterministic = "
                  "false");
    if (precision == "fp16")
      throw Error(ErrorKind::config,
                  "train.attention_backward = flash-attention-4 with train.precision = fp16: its kernels are "
                  "built for bf16 activations",
                  "set train.attention_backward = cudnn, or use bf16 activations (bf16, fp8, fp8-current, mxfp8, "
                  "nvfp4)");
    if (c.train.seq_len <= 128)
      throw Error(ErrorKind::config,
                  strf("train.attention_backward = flash-attention-4 with train.seq_len = %lld: it needs more than "
                       "128 tokens (one tile is a kernel variant of its own)",
                       static_cast<long long>(c.train.seq_len)),
                  "set train.attention_backward = cudnn for sequences this short");
  }
  if (c.train.global_batch_size != 0 && c.train.global_batch_size % c.train.micro_batch_size != 0)
    throw Error(ErrorKind::config,
                strf("train.global_batch_size = %lld is not a multiple of train.micro_batch_size = %lld",
                     static_cast<long long>(c.train.global_batch_size),
                     static_cast<long long>(c.train.micro_batch_size)),
                "gradient accumulation needs a whole number of micro-batches; adjust either key");
}

}  // namespace mxtrain
