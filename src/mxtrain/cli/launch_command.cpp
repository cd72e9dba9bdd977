// `mxtrain launch`: one rank per GPU on this node (runtime/launcher.hpp). Defaults come from the
// node's environment: SageMaker (hosts, current host, GPUs per host, port 7777) or a Slurm / MPI
// step with one task per node; explicit flags win.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <memory>

#include "mxtrain/cli/bounds.hpp"
#include "mxtrain/cli/commands.hpp"
#include "mxtrain/distributed/communicator_factory.hpp"
#include "mxtrain/runtime/launcher.hpp"
#include "mxtrain/runtime/rank_environment.hpp"

namespace mxtrain::cli {
namespace {

struct LaunchArguments {
  int nproc_per_node = -1, nnodes = -1, node_rank = -1, master_port = -1;
  std::string master_addr;
  runtime::LaunchOptions options;
};

// The node-level defaults: which node this is and where rank 0 listens.
void apply_node_environment(runtime::LaunchOptions& options, int visible_gpus) {
  options.nproc_per_node = std::max(1, visible_gpus);
  const runtime::RankEnvironment node =
      runtime::resolve_rank_environment({}, runtime::process_environment(), visible_gpus);
  const bool one_task_per_node = node.local_world_size == 1 && (node.source == runtime::EnvironmentSource::slurm ||
                                                                node.started_by_mpi());
  if (node.source == runtime::EnvironmentSource::sagemaker) {
    options.nproc_per_node = node.local_world_size;
    options.nnodes = node.nodes;
    options.node_rank = node.node_rank;
    if (!node.network_interface.empty()) options.environment["NCCL_SOCKET_IFNAME"] = node.network_interface;
  } else if (one_task_per_node) {
    options.nnodes = node.world_size;
    options.node_rank = node.rank;
  }
  options.master_addr = node.master_addr;
  options.master_port = node.master_port;
}

}  // namespace

void add_launch_command(CLI::App& app) {
  CLI::App* command = app.add_subcommand(
      "launch",
      "start one training process per GPU on this node, with the torchrun rank variables; forwards SIGTERM/SIGINT, "
      "and stops the job naming the rank when one fails. Usage: mxtrain launch --nproc-per-node 8 -- train "
      "config.toml");
  auto arguments = std::make_shared<LaunchArguments>();
  command->add_option("--nproc-per-node", arguments->nproc_per_node,
                      "ranks on this node (default: the visible GPUs; SageMaker: SM_NUM_GPUS)")
      ->check(integer_range(1, kMaxRanks));
  command->add_option("--nnodes", arguments->nnodes, "nodes in the job (default 1, or from SageMaker/Slurm)")
      ->check(integer_range(1, kMaxRanks));
  command->add_option("--node-rank", arguments->node_rank, "this node's index, 0 .. nnodes-1")
      ->check(integer_range(0, kMaxRanks - 1));
  command->add_option("--master-addr", arguments->master_addr, "address of node 0 (default 127.0.0.1)");
  command->add_option("--master-port", arguments->master_port, "port rank 0 listens on (default 29500)")
      ->check(CLI::Range(1, 65535));
  command->add_option("--log-dir", arguments->options.log_dir, "per-rank logs: DIR/rank_NNNNN.log")->capture_default_str();
  command->add_option("--kill-timeout", arguments->options.kill_timeout_s,
                      "seconds between SIGTERM and SIGKILL for the other ranks after one fails")
      ->capture_default_str();
  command->add_option("--tail", arguments->options.tail_lines, "log lines of a failed rank to print")->capture_default_str();
  command->add_flag("--exec", arguments->options.exec_program,
                    "the command after -- is a program to run (e.g. a wrapper script), not an mxtrain subcommand");
  command->add_option("command", arguments->options.command, "after --: the mxtrain subcommand and its arguments")
      ->required();
  command->callback([arguments] {
    runtime::LaunchOptions options = arguments->options;
    const int visible_gpus = visible_gpu_count();
    apply_node_environment(options, visible_gpus);
    if (arguments->nproc_per_node > 0) options.nproc_per_node = arguments->nproc_per_node;
    if (arguments->nnodes > 0) options.nnodes = arguments->nnodes;
    if (arguments->node_rank >= 0) options.node_rank = arguments->node_rank;
    if (!arguments->master_addr.empty()) options.master_addr = arguments->master_addr;
    if (arguments->master_port > 0) options.master_port = arguments->master_port;
    runtime::validate_launch(options, visible_gpus);
    const int code = runtime::run_launch(options);
    if (code != 0) throw CLI::RuntimeError(code);
  });
}

}  // namespace mxtrain::cli
