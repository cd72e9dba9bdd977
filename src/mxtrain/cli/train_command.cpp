#include <CLI/CLI.hpp>
#include <cstdio>
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
#include "mxtrain/plan/memory_check.hpp"
#include "mxtrain/runtime/launcher.hpp"
#include "mxtrain/train/session.hpp"
#include "mxtrain/train/trainer.hpp"

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

}  // namespace

void add_train_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "train", "train a model; with no arguments, the embedded default (a 3M-parameter byte-level Llama on the "
               "fortunes corpus prepared by scripts/setup.sh)");
  auto arguments = std::make_shared<ConfigArguments>();
  auto print_config = std::make_shared<bool>(false);
  auto explicit_rank = std::make_shared<runtime::ExplicitRank>();
  add_config_arguments(*command, *arguments, train_flags());
  command->add_flag_callback(
      "--resume", [arguments] { arguments->flag_values.emplace_back("checkpoint.resume", "always"); },
      "require resuming from the run directory's newest valid checkpoint [checkpoint.resume=always]");
  command->add_flag_callback(
      "--no-resume", [arguments] { arguments->flag_values.emplace_back("checkpoint.resume", "never"); },
      "start fresh; refuses a run directory that already has checkpoints [checkpoint.resume=never]");
  command->add_flag("--print-config", *print_config, "print the effective config as TOML and exit");
  // Ranks by hand (they win over torchrun, Slurm, MPI and SageMaker variables).
  command->add_option("--rank", explicit_rank->rank, "this process's rank (with --world-size)")
      ->check(integer_range(0, kMaxRanks - 1))->group("Ranks by hand");
  command->add_option("--world-size", explicit_rank->world_size, "ranks in the job")
      ->check(integer_range(1, kMaxRanks))->group("Ranks by hand");
  command->add_option("--local-rank", explicit_rank->local_rank, "rank on this node (default: rank mod local world)")
      ->check(integer_range(0, kMaxRanks - 1))->group("Ranks by hand");
  command->add_option("--local-world-size", explicit_rank->local_world_size, "ranks per node (default: world size)")
      ->check(integer_range(1, kMaxRanks))->group("Ranks by hand");
  command->add_option("--master-addr", explicit_rank->master_addr, "address of rank 0's node")->group("Ranks by hand");
  command->add_option("--master-port", explicit_rank->master_port, "port rank 0 listens on (default 29500)")
      ->check(CLI::Range(1, 65535))->group("Ranks by hand");
  command->callback([arguments, print_config, explicit_rank] {
    ConfigSources sources;
    sources.toml_path = arguments->config_path;
    sources.overrides = overrides(*arguments);
    RunConfig config = load_run_config(sources);
    if (*print_config) {
      std::fputs(config_to_toml(config).c_str(), stdout);
      return;
    }
    TrainerContext context;
    context.source_dir = MXTRAIN_SOURCE_DIR;
    context.environment =
        runtime::resolve_rank_environment(*explicit_rank, runtime::process_environment(), visible_gpu_count());
    if (context.environment.node_level_only && context.environment.world_size > 1) {
      const int code = train_as_launcher(context.environment);
      if (code != 0) throw CLI::RuntimeError(code);
      return;
    }
    context.environment.node_level_only = false;
    // No allocation the host cannot back: the planner's figure first (plan/memory_check.hpp).
    if (resolve_device(config.train.device) == "cpu")
      check_cpu_training_memory(config, context.environment.world_size, context.environment.local_world_size,
                                host_available_bytes());
    Trainer(config, context).run();
    finish_communication();
  });
}

}  // namespace mxtrain::cli
