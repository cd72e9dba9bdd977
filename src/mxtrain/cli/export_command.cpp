// `mxtrain export CHECKPOINT_OR_RUN_DIR OUT_DIR`: a native checkpoint (any world size or sharding
// strategy: segments are read by range) → a Hugging Face model directory (interop/hf_export.hpp).
#include <CLI/CLI.hpp>

#include <cstdio>
#include <filesystem>
#include <memory>
#include <string>

#include "mxtrain/cli/commands.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/train/checkpoint_export.hpp"

namespace mxtrain::cli {
namespace {

struct ExportArguments {
  std::string source, out_dir, dtype = "bf16";
  double max_shard_gb = 5.0;
};

void run_export(const ExportArguments& arguments) {
  DType dtype = DType::bf16;
  if (!parse_dtype(arguments.dtype, &dtype) || (dtype != DType::bf16 && dtype != DType::f32))
    throw Error(ErrorKind::config, "--dtype " + arguments.dtype + " is not bf16 or f32", "use --dtype bf16 or f32");
  const CheckpointExport exported = export_checkpoint_to_hf(arguments.source, arguments.out_dir, dtype,
                                                            static_cast<uint64_t>(arguments.max_shard_gb * 1e9));
  std::printf("export: %s (step %lld) -> %s: %lld tensors, %s bytes in %s, %s\n", exported.checkpoint.c_str(),
              static_cast<long long>(exported.step), arguments.out_dir.c_str(),
              static_cast<long long>(exported.result.tensors),
              log::with_commas(static_cast<double>(exported.result.tensor_bytes)).c_str(), arguments.dtype.c_str(),
              exported.family == ModelFamily::gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM");
  for (const std::string& file : exported.result.files) std::printf("wrote %s/%s\n", arguments.out_dir.c_str(), file.c_str());
}

}  // namespace

void add_export_command(CLI::App& app) {
  auto arguments = std::make_shared<ExportArguments>();
  CLI::App* command = app.add_subcommand(
      "export", "Write a checkpoint as a Hugging Face model directory (safetensors) that transformers loads");
  command->footer(
      "Reads the newest checkpoint of a run directory (or the checkpoint directory given), from any\n"
      "number of ranks, and writes config.json, generation_config.json, model.safetensors (sharded with\n"
      "an index above --max-shard-gb) and the run's tokenizer files. OUT_DIR must be new or empty.\n"
      "Example: mxtrain export runs/tiny exported/tiny  (then AutoModelForCausalLM.from_pretrained)");
  command->add_option("checkpoint", arguments->source, "A run directory or one of its checkpoints/step_* directories")
      ->required()
      ->type_name("DIR");
  command->add_option("out", arguments->out_dir, "The Hugging Face model directory to write")->required()->type_name("DIR");
  command->add_option("--dtype", arguments->dtype, "Weight dtype in the files: bf16 or f32")
      ->capture_default_str()
      ->check(CLI::IsMember({"bf16", "f32"}));
  command->add_option("--max-shard-gb", arguments->max_shard_gb, "Largest safetensors file before sharding, in GB")
      ->capture_default_str()
      ->check(CLI::Range(0.001, 1000.0));
  command->callback([arguments]() { run_export(*arguments); });
}

}  // namespace mxtrain::cli
