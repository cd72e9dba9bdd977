// `mxtrain launch`: one process per GPU on this node, with the torchrun variables (RANK,
// LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT) set, so each
// child resolves its rank like any torchrun job. The launcher
//   - copies each rank's output to <log_dir>/rank_NNNNN.log and echoes it to its own stdout;
//   - forwards SIGTERM, SIGINT and SIGHUP to every child (they finish the step, save, exit 0);
//   - reaps the children; when one fails, it sends SIGTERM to the others, SIGKILL after
//     kill_timeout_s, and reports the failed rank with the last lines of its log.
// Children die with the launcher (PR_SET_PDEATHSIG), so a SIGKILLed launcher leaves no orphans.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace mxtrain::runtime {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string log_dir = "launch_logs";
  std::vector<std::string> command;  // what follows `--`
  bool exec_program = false;         // command[0] is a program to run, not an mxtrain subcommand
  double kill_timeout_s = 15;        // after a failure: SIGTERM to the others, SIGKILL this much later
  int tail_lines = 20;               // lines of the failed rank's log in the report
  std::map<std::string, std::string> environment;  // extra variables for every child (unless set)
};

// Checks options against this machine (GPU count, port) and throws Error(config) with the fix.
void validate_launch(const LaunchOptions& options, int visible_gpus);

// Starts the ranks and returns the exit status for the launcher: 0 when every rank exited 0,
// otherwise the failed rank's status (128 + signal for a killed rank).
int run_launch(const LaunchOptions& options);

}  // namespace mxtrain::runtime
