// `mxtrain generate SOURCE --prompt TEXT`: text from a model, on the CPU or the GPU. SOURCE is an
// mxtrain run directory or checkpoint (its run's tokenizer), or a Hugging Face model directory
// (config.json + safetensors, and its tokenizer files). Sampling: train/generate.hpp.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "mxtrain/cli/commands.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/data/tokenizer.hpp"
#include "mxtrain/interop/hf_checkpoint.hpp"
#include "mxtrain/model/local_parameters.hpp"
#include "mxtrain/train/checkpoint.hpp"
#include "mxtrain/train/generate.hpp"
#include "mxtrain/train/session.hpp"

namespace mxtrain::cli {
namespace {

namespace fs = std::filesystem;

struct GenerateArguments {
  std::string source, prompt, tokenizer, device = "auto";
  SamplingOptions sampling;
  int threads = 0;
};

// The model's shape, tokenizer and weights from either kind of source.
struct Source {
  ModelConfig config;
  std::string tokenizer;
  std::unique_ptr<CheckpointReader> native;
  std::unique_ptr<interop::HfCheckpoint> hugging_face;
  ParameterValues values;
};

Source open_source(const std::string& path) {
  Source source;
  std::error_code error;
  const bool hugging_face = fs::is_regular_file(fs::path(path) / "config.json", error) &&
                            !fs::is_regular_file(fs::path(path) / "manifest.json", error) &&
                            !fs::is_directory(fs::path(path) / "checkpoints", error);
  if (hugging_face) {
    source.hugging_face = std::make_unique<interop::HfCheckpoint>(path);
    source.config = source.hugging_face->config();
    source.hugging_face->check(build_layout(source.config));
    if (!data::tokenizer_file_in(path).empty()) source.tokenizer = path;
    source.values = source.hugging_face->parameter_values();
    return source;
  }
  source.native = std::make_unique<CheckpointReader>(resolve_checkpoint(path));
  const RunConfig run = config_from_json(source.native->meta().config);
  source.config = run.model;
  source.tokenizer = run.data.tokenizer;
  source.values = source.native->master_values(build_layout(source.config));
  return source;
}

void run_generate(GenerateArguments& arguments) {
  const Source source = open_source(arguments.source);
  const std::string tokenizer_name = arguments.tokenizer.empty() ? source.tokenizer : arguments.tokenizer;
  if (tokenizer_name.empty())
    throw Error(ErrorKind::config, arguments.source + " holds no tokenizer.json or tokenizer.model",
                "pass the model's tokenizer with --tokenizer (a file, a model directory, or byte)");
  const auto tokenizer = data::make_tokenizer(tokenizer_name);
  if (tokenizer->vocab_size() > source.config.vocab_size)
    throw Error(ErrorKind::config,
                strf("tokenizer %s has %lld tokens, more than the model's vocabulary of %lld", tokenizer_name.c_str(),
                     static_cast<long long>(tokenizer->vocab_size()), static_cast<long long>(source.config.vocab_size)),
                "pass the tokenizer the model was trained with (--tokenizer)");
  std::vector<int32_t> prompt = tokenizer->encode(arguments.prompt);
  if (tokenizer->bos_id() && (prompt.empty() || prompt.front() != *tokenizer->bos_id()) && tokenizer_name != "byte")
    prompt.insert(prompt.begin(), *tokenizer->bos_id());
  if (prompt.empty())
    throw Error(ErrorKind::config, "the prompt is empty and the tokenizer has no beginning-of-sequence token",
                "give a prompt: --prompt \"Once upon a time\"");
  arguments.sampling.stop_token = tokenizer->eos_id().value_or(-1);

  BackendOptions options;
  options.threads = arguments.threads;
  std::unique_ptr<Backend> backend = create_backend(resolve_device(arguments.device), options);
  LocalParameterStore store(*backend, source.config, DType::f32, DType::f32);
  store.initialize(source.values);
  TransformerOptions transformer;
  transformer.activation_dtype = DType::f32;
  Transformer model(source.config, transformer, *backend, store);
  const std::vector<int32_t> produced =
      generate_tokens(model, *backend, prompt, source.config.attention_context(), arguments.sampling);
  std::printf("%s%s\n", data::printable_text(arguments.prompt).c_str(),
              data::printable_text(tokenizer->decode(produced)).c_str());
  std::fflush(stdout);
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto arguments = std::make_shared<GenerateArguments>();
  CLI::App* command = app.add_subcommand("generate", "Sample text from a trained run or a Hugging Face model");
  command->footer(
      "Each token reruns the model over the text so far (no KV cache yet), in FP32, on the CPU or the\n"
      "GPU; the same seed gives the same text. Example:\n"
      "  mxtrain generate runs/tiny --prompt \"The meaning of life\" --max-tokens 80 --seed 1");
  command->add_option("source", arguments->source,
                      "An mxtrain run directory or checkpoint, or a Hugging Face model directory")
      ->required()
      ->type_name("DIR");
  command->add_option("--prompt", arguments->prompt, "The text to continue")->type_name("TEXT");
  command->add_option("--max-tokens", arguments->sampling.max_tokens, "Most tokens to add")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{1}, int64_t{100000}));
  command->add_option("--temperature", arguments->sampling.temperature, "Softmax temperature; 0 takes the likeliest")
      ->capture_default_str()
      ->check(CLI::Range(0.0, 100.0));
  command->add_option("--top-k", arguments->sampling.top_k, "Draw from the K likeliest tokens (0: all)")
      ->capture_default_str()
      ->check(CLI::Range(int64_t{0}, int64_t{1} << 24));
  command->add_option("--top-p", arguments->sampling.top_p, "Draw from the likeliest tokens holding this much probability")
      ->capture_default_str()
      ->check(CLI::Range(1e-6, 1.0));
  command->add_option("--seed", arguments->sampling.seed, "Seed of the draws")->capture_default_str();
  command->add_option("-d,--device", arguments->device, "auto, cpu or cuda")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}));
  command->add_option("--tokenizer", arguments->tokenizer,
                      "byte, a tokenizer.json, a .model file or a model directory (default: the source's)")
      ->type_name("NAME|PATH");
  command->add_option("--threads", arguments->threads, "CPU threads (0: every core)")->check(CLI::Range(0, 4096));
  command->callback([arguments]() { run_generate(*arguments); });
}

}  // namespace mxtrain::cli
