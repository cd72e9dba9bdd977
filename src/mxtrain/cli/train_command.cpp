#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <fstream>
#include <iterator>
#include <memory>

#include "mxtrain/build_info.hpp"
#include "mxtrain/cli/bounds.hpp"
#include "mxtrain/cli/commands.hpp"
#include "mxtrain/cli/flags.hpp"
#include "mxtrain/config/loader.hpp"
#include "mxtrain/core/error.hpp"
#include "mxtrain/core/host_memory.hpp"
#include "mxtrain/core/log.hpp"
#include "mxtrain/distributed/communicator_factory.hpp"
#include "mxtrain/plan/run_prediction.hpp"
#include "mxtrain/runtime/launcher.hpp"
#include "mxtrain/runtime/sagemaker_paths.hpp"
#include "mxtrain/sagemaker/job.hpp"
#include "mxtrain/plan/memory_check.hpp"
#include "mxtrain/train/session.hpp"
#include "mxtrain/train/trainer.hpp"

extern char** environ;

namespace mxtrain::cli {
namespace {

// This process's arguments after the program name (to start the same command once per rank).
std::vector<std::string> own_arguments() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> arguments;
  size_t start = 0;
  while (start < all.size()) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    arguments.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  if (!arguments.empty()) arguments.erase(arguments.begin());
  return arguments;
}

// SageMaker runs `<entrypoint> train` once per host: with several GPUs or hosts this process
// becomes the node's launcher, and the ranks it starts see torchrun variables (which take
// precedence) and train.
int train_as_launcher(const runtime::RankEnvironment& node) {
  runtime::LaunchOptions options;
  options.nproc_per_node = node.local_world_size;
  options.nnodes = node.nodes;
  options.node_rank = node.node_rank;
  options.master_addr = node.master_addr;
  options.master_port = node.master_port;
  options.command = own_arguments();
  if (!node.network_interface.empty()) options.environment["NCCL_SOCKET_IFNAME"] = node.network_interface;
  log::info(strf("%s: starting %d rank(s) on this node (node %d of %d)", runtime::environment_source_name(node.source),
                 node.local_world_size, node.node_rank, node.nodes));
  runtime::validate_launch(options, visible_gpu_count());
  return runtime::run_launch(options);
}

struct TrainArguments {
  ConfigArguments config;
  bool print_config = false;
  bool sagemaker = false;
  runtime::ExplicitRank explicit_rank;
};

std::vector<std::string> environment_entries() {
  std::vector<std::string> entries;
  for (char** entry = environ; entry && *entry; ++entry) entries.emplace_back(*entry);
  return entries;
}

// Trains with `config`: this process is a rank, or (SageMaker: one process per host) the
// launcher of this node's ranks. Returns the node count.
int train_or_launch(RunConfig& config, const TrainArguments& arguments, std::function<void()> prepare_data) {
  TrainerContext context;
  context.source_dir = MXTRAIN_SOURCE_DIR;
  context.predict = predict_run;
  context.environment =
      runtime::resolve_rank_environment(arguments.explicit_rank, runtime::process_environment(), visible_gpu_count());
  const int nodes = context.environment.nodes;
  if (context.environment.node_level_only && context.environment.world_size > 1) {
    const int code = train_as_launcher(context.environment);
    if (code != 0)
      throw Error(ErrorKind::system, strf("a rank of this node failed (the launcher's status %d)", code),
                  "the rank's own error is in its log above (and in the failure file when it wrote one)");
    return nodes;
  }
  context.environment.node_level_only = false;
  context.prepare_data = std::move(prepare_data);
  // No allocation the host cannot back: the planner's figure first (plan/memory_check.hpp).
  if (resolve_device(config.train.device) == "cpu")
    check_cpu_training_memory(config, context.environment.world_size, context.environment.local_world_size,
                              host_available_bytes());
  Trainer(config, context).run();
  finish_communication();
  return nodes;
}

// `mxtrain train` in a SageMaker job: the job's hyperparameters and channels come before the
// command line's overrides; on the first host the job's outputs are written at the end; any
// error goes to the failure file too.
void train_sagemaker_job(const TrainArguments& arguments, const std::vector<std::string>& hyperparameter_arguments,
                         const runtime::SageMakerPaths& paths, const std::string& evidence) {
  try {
    const runtime::EnvironmentLookup lookup = runtime::process_environment();
    const sagemaker::Job job = sagemaker::Job::open(paths, evidence, lookup, environment_entries(),
                                                    hyperparameter_arguments);
    ConfigSources sources;
    sources.toml_path = arguments.config.config_path.empty() ? job.config_file() : arguments.config.config_path;
    sources.overrides = job.overrides();
    for (const auto& assignment : overrides(arguments.config)) sources.overrides.push_back(assignment);
    RunConfig config = load_run_config(sources);
    if (arguments.print_config) {
      std::fputs(config_to_toml(config).c_str(), stdout);
      return;
    }
    const runtime::RankEnvironment environment =
        runtime::resolve_rank_environment(arguments.explicit_rank, lookup, visible_gpu_count());
    // The process SageMaker started (not a rank that a launcher started) speaks for the job.
    const bool job_process = environment.source == runtime::EnvironmentSource::sagemaker ||
                             environment.source == runtime::EnvironmentSource::single;
    if (job_process) job.announce();
    const int nodes = train_or_launch(config, arguments, job.data_preparation(config));
    if (job_process && environment.node_rank == 0) job.finish(config, nodes);
  } catch (const Error& error) {
    sagemaker::record_failure(paths, error.full_message());
    throw;
  } catch (const std::exception& error) {
    sagemaker::record_failure(paths, std::string("unexpected error: ") + error.what());
    throw;
  }
}

}  // namespace

void add_train_command(CLI::App& app, std::shared_ptr<std::vector<std::string>> hyperparameter_arguments) {
  CLI::App* command = app.add_subcommand(
      "train", "train a model; with no arguments, the embedded default (a 3M-parameter byte-level Llama on the "
               "fortunes corpus prepared by scripts/setup.sh); inside a SageMaker training job, the job's "
               "hyperparameters and channels (docs/sagemaker.md)");
  auto arguments = std::make_shared<TrainArguments>();
  add_config_arguments(*command, arguments->config, train_flags());
  command->add_flag_callback(
      "--resume", [arguments] { arguments->config.flag_values.emplace_back("checkpoint.resume", "always"); },
      "require resuming from the run directory's newest valid checkpoint [checkpoint.resume=always]");
  command->add_flag_callback(
      "--no-resume", [arguments] { arguments->config.flag_values.emplace_back("checkpoint.resume", "never"); },
      "start fresh; refuses a run directory that already has checkpoints [checkpoint.resume=never]");
  command->add_flag("--print-config", arguments->print_config, "print the effective config as TOML and exit");
  command->add_flag("--sagemaker", arguments->sagemaker,
                    "run as a SageMaker training job even where none is detected, and fail if the job's input "
                    "config directory is missing (detected otherwise from MXTRAIN_SAGEMAKER_ROOT, SM_* variables "
                    "or /opt/ml/input/config; docs/sagemaker.md)");
  // Ranks by hand (they win over torchrun, Slurm, MPI and SageMaker variables).
  runtime::ExplicitRank& explicit_rank = arguments->explicit_rank;
  command->add_option("--rank", explicit_rank.rank, "this process's rank (with --world-size)")
      ->check(integer_range(0, kMaxRanks - 1))->group("Ranks by hand");
  command->add_option("--world-size", explicit_rank.world_size, "ranks in the job")
      ->check(integer_range(1, kMaxRanks))->group("Ranks by hand");
  command->add_option("--local-rank", explicit_rank.local_rank, "rank on this node (default: rank mod local world)")
      ->check(integer_range(0, kMaxRanks - 1))->group("Ranks by hand");
  command->add_option("--local-world-size", explicit_rank.local_world_size, "ranks per node (default: world size)")
      ->check(integer_range(1, kMaxRanks))->group("Ranks by hand");
  command->add_option("--master-addr", explicit_rank.master_addr, "address of rank 0's node")->group("Ranks by hand");
  command->add_option("--master-port", explicit_rank.master_port, "port rank 0 listens on (default 29500)")
      ->check(CLI::Range(1, 65535))->group("Ranks by hand");
  command->callback([arguments, hyperparameter_arguments] {
    const std::vector<std::string>& rest = *hyperparameter_arguments;
    const runtime::EnvironmentLookup lookup = runtime::process_environment();
    const runtime::SageMakerPaths paths = runtime::sagemaker_paths(lookup);
    std::string evidence = runtime::sagemaker_job_evidence(lookup, paths);
    if (arguments->sagemaker && evidence.empty()) {
      std::error_code error;
      if (!std::filesystem::is_directory(paths.input_config_dir, error))
        throw Error(ErrorKind::config, "--sagemaker: no SageMaker input config directory " + paths.input_config_dir,
                    "run inside a SageMaker training job, or lay one out and set MXTRAIN_SAGEMAKER_ROOT to its root");
      evidence = "--sagemaker";
    }
    if (!evidence.empty()) {
      train_sagemaker_job(*arguments, rest, paths, evidence);
      return;
    }
    if (!rest.empty())
      throw Error(ErrorKind::config, "mxtrain train: unknown option or extra argument '" + rest.front() + "'",
                  "see `mxtrain train --help`; `--name value` hyperparameters are read only in a SageMaker job "
                  "(docs/sagemaker.md)");
    ConfigSources sources;
    sources.toml_path = arguments->config.config_path;
    sources.overrides = overrides(arguments->config);
    RunConfig config = load_run_config(sources);
    if (arguments->print_config) {
      std::fputs(config_to_toml(config).c_str(), stdout);
      return;
    }
    train_or_launch(config, *arguments, {});
  });
}

}  // namespace mxtrain::cli
