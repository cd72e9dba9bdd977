#include "mxtrain/runtime/launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>

#include "mxtrain/core/error.hpp"
#include "mxtrain/runtime/tcp_rendezvous.hpp"

extern char** environ;

namespace mxtrain::runtime {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
  int rank = 0, local_rank = 0;
  pid_t pid = -1;
  int output = -1;            // read end of the child's stdout+stderr
  std::FILE* log = nullptr;
  std::string log_path, partial;
  std::deque<std::string> tail;
  bool running = true;
  int status = 0;             // from waitpid, once !running
};

// Signals reach the loop through a self-pipe written by a handler. A signalfd would need the
// signals blocked in every thread, and the CUDA driver and OpenBLAS start threads of their own
// before the launcher runs (a SIGTERM delivered to one of them would kill the launcher).
int signal_pipe_write = -1;

extern "C" void on_launcher_signal(int signal_number) {
  const int saved = errno;
  const unsigned char byte = static_cast<unsigned char>(signal_number);
  [[maybe_unused]] const ssize_t written = ::write(signal_pipe_write, &byte, 1);
  errno = saved;
}

void say(const std::string& text) {
  std::fprintf(stderr, "mxtrain launch: %s\n", text.c_str());
  std::fflush(stderr);
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return strf("exited with status %d", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return strf("was killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  return "stopped";
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

bool failed(int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != 0; }

// The environment of rank `local_rank`: this process's, with the rank variables replaced.
std::vector<std::string> child_environment(const LaunchOptions& options, int local_rank,
                                           const std::string& launch_id) {
  const int world = options.nnodes * options.nproc_per_node;
  const int rank = options.node_rank * options.nproc_per_node + local_rank;
  std::map<std::string, std::string> set = {
      {"RANK", std::to_string(rank)},
      {"LOCAL_RANK", std::to_string(local_rank)},
      {"WORLD_SIZE", std::to_string(world)},
      {"LOCAL_WORLD_SIZE", std::to_string(options.nproc_per_node)},
      {"GROUP_RANK", std::to_string(options.node_rank)},
      {"ROLE_RANK", std::to_string(rank)},
      {"ROLE_WORLD_SIZE", std::to_string(world)},
      {"MASTER_ADDR", options.master_addr},
      {"MASTER_PORT", std::to_string(options.master_port)},
      {"MXTRAIN_LAUNCH_ID", launch_id},
      {"MXTRAIN_LAUNCH_LOG_DIR", options.log_dir},
  };
  std::map<std::string, std::string> defaults = options.environment;
  defaults.emplace("NCCL_NVLS_ENABLE", "0");  // NVLink multicast off unless the user set it
  std::vector<std::string> result;
  for (char** entry = environ; *entry; ++entry) {
    std::string text(*entry);
    std::string name = text.substr(0, text.find('='));
    if (set.count(name)) continue;
    defaults.erase(name);  // the user's own value wins over our defaults
    result.push_back(text);
  }
  for (const auto& [name, value] : set) result.push_back(name + "=" + value);
  for (const auto& [name, value] : defaults) result.push_back(name + "=" + value);
  return result;
}

std::string self_executable() {
  char path[4096] = {};
  const ssize_t length = ::readlink("/proc/self/exe", path, sizeof path - 1);
  if (length <= 0) throw Error(ErrorKind::system, "cannot find the mxtrain executable (/proc/self/exe)", "");
  return std::string(path, static_cast<size_t>(length));
}

// In the child: never returns.
[[noreturn]] void exec_rank(const LaunchOptions& options, const std::string& program, int output_fd,
                            std::vector<std::string>& environment, pid_t launcher) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != launcher) ::_exit(1);
  sigset_t none;
  sigemptyset(&none);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  for (int signal_number : {SIGTERM, SIGINT, SIGHUP, SIGCHLD}) ::signal(signal_number, SIG_DFL);
  const int null_input = ::open("/dev/null", O_RDONLY);
  if (null_input >= 0) ::dup2(null_input, STDIN_FILENO);
  ::dup2(output_fd, STDOUT_FILENO);
  ::dup2(output_fd, STDERR_FILENO);
  std::vector<std::string> arguments;
  if (options.exec_program) {
    arguments = options.command;
  } else {
    arguments.push_back("mxtrain");
    arguments.insert(arguments.end(), options.command.begin(), options.command.end());
  }
  std::vector<char*> argv, envp;
  for (std::string& argument : arguments) argv.push_back(argument.data());
  argv.push_back(nullptr);
  for (std::string& entry : environment) envp.push_back(entry.data());
  envp.push_back(nullptr);
  if (options.exec_program) {
    environ = envp.data();
    ::execvp(argv[0], argv.data());
  } else {
    ::execve(program.c_str(), argv.data(), envp.data());
  }
  std::fprintf(stderr, "mxtrain launch: cannot start %s: %s\n", argv[0], std::strerror(errno));
  ::_exit(127);
}

void echo_line(const Child& child, const std::string& line) {
  // mxtrain's own lines carry "[rank R]" already; anything else gets it here.
  if (line.rfind("[rank ", 0) == 0) {
    std::fprintf(stdout, "%s\n", line.c_str());
  } else {
    std::fprintf(stdout, "[rank %d] %s\n", child.rank, line.c_str());
  }
}

void keep_line(Child& child, const std::string& line, int tail_lines) {
  child.tail.push_back(line);
  while (static_cast<int>(child.tail.size()) > tail_lines) child.tail.pop_front();
}

// Reads what is available; false at end of output.
bool pump_output(Child& child, int tail_lines) {
  char buffer[8192];
  const ssize_t got = ::read(child.output, buffer, sizeof buffer);
  if (got < 0 && (errno == EINTR || errno == EAGAIN)) return true;
  if (got <= 0) {
    if (!child.partial.empty()) {
      std::fprintf(child.log, "%s\n", child.partial.c_str());
      echo_line(child, child.partial);
      keep_line(child, child.partial, tail_lines);
      child.partial.clear();
    }
    std::fflush(child.log);
    std::fflush(stdout);
    return false;
  }
  std::fwrite(buffer, 1, static_cast<size_t>(got), child.log);
  std::fflush(child.log);
  child.partial.append(buffer, static_cast<size_t>(got));
  size_t newline;
  while ((newline = child.partial.find('\n')) != std::string::npos) {
    std::string line = child.partial.substr(0, newline);
    child.partial.erase(0, newline + 1);
    echo_line(child, line);
    keep_line(child, line, tail_lines);
  }
  std::fflush(stdout);
  return true;
}

}  // namespace

void validate_launch(const LaunchOptions& o, int visible_gpus) {
  if (o.command.empty())
    throw Error(ErrorKind::config, "nothing to launch", "put the mxtrain command after --, e.g. `mxtrain launch "
                                                        "--nproc-per-node 8 -- train config.toml`");
  if (o.nproc_per_node < 1) throw Error(ErrorKind::config, "--nproc-per-node must be at least 1", "");
  if (o.nnodes < 1 || o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw Error(ErrorKind::config, strf("--node-rank %d is not in [0, --nnodes %d)", o.node_rank, o.nnodes),
                "number the nodes 0 .. nnodes-1, with the same --nnodes on every node");
  if (o.master_port < 1 || o.master_port > 65535)
    throw Error(ErrorKind::config, strf("--master-port %d is not a TCP port", o.master_port), "use 1024..65535");
  if (o.exec_program) return;
  if (visible_gpus == 0 && o.nproc_per_node > 1)
    throw Error(ErrorKind::config,
                strf("mxtrain launch starts one rank per GPU, and this machine shows no CUDA GPU (asked for %d ranks)",
                     o.nproc_per_node),
                strf("CPU ranks exchange gradients through MPI: run `mpirun -np %d mxtrain train ...` (as root add "
                     "--allow-run-as-root; see docs/distributed.md), or launch one rank",
                     o.nproc_per_node));
  if (visible_gpus > 0 && o.nproc_per_node > visible_gpus)
    throw Error(ErrorKind::config,
                strf("--nproc-per-node %d but this node shows %d GPU(s)", o.nproc_per_node, visible_gpus),
                "start at most one rank per GPU (check CUDA_VISIBLE_DEVICES)");
  if (o.node_rank == 0 && o.nnodes * o.nproc_per_node > 1 && !tcp_port_is_free(o.master_port))
    throw Error(ErrorKind::config, strf("port %d on this node is already in use", o.master_port),
                "another job probably holds it: pass a free one with --master-port");
}

int run_launch(const LaunchOptions& options) {
  std::error_code error;
  std::filesystem::create_directories(options.log_dir, error);
  if (error)
    throw Error(ErrorKind::system, "cannot create the log directory " + options.log_dir + ": " + error.message(),
                "choose a writable --log-dir");
  const std::string program = options.exec_program ? "" : self_executable();

  int signal_pipe[2];
  if (::pipe2(signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(ErrorKind::system, std::string("pipe: ") + std::strerror(errno), "");
  signal_pipe_write = signal_pipe[1];
  const int signals = signal_pipe[0];
  constexpr int kHandled[] = {SIGCHLD, SIGTERM, SIGINT, SIGHUP};
  struct sigaction previous[4];
  for (size_t i = 0; i < 4; ++i) {
    struct sigaction action {};
    action.sa_handler = on_launcher_signal;
    sigemptyset(&action.sa_mask);
    action.sa_flags = SA_RESTART;
    ::sigaction(kHandled[i], &action, &previous[i]);
  }

  const pid_t launcher = ::getpid();
  // Names this launch in every rank's environment (the same job's ranks share it per node).
  const std::string launch_id = strf("%d-%lld", static_cast<int>(launcher),
                                     static_cast<long long>(std::chrono::system_clock::now().time_since_epoch().count()));
  std::vector<Child> children(static_cast<size_t>(options.nproc_per_node));
  for (int local = 0; local < options.nproc_per_node; ++local) {
    Child& child = children[static_cast<size_t>(local)];
    child.local_rank = local;
    child.rank = options.node_rank * options.nproc_per_node + local;
    child.log_path = options.log_dir + strf("/rank_%05d.log", child.rank);
    child.log = std::fopen(child.log_path.c_str(), "we");  // not inherited by later ranks
    if (!child.log) throw Error(ErrorKind::system, "cannot write " + child.log_path, "choose a writable --log-dir");
    int pipe_fds[2];
    if (::pipe2(pipe_fds, O_CLOEXEC) != 0)
      throw Error(ErrorKind::system, std::string("pipe: ") + std::strerror(errno), "");
    std::vector<std::string> environment = child_environment(options, local, launch_id);
    std::fflush(stdout);
    std::fflush(stderr);
    const pid_t pid = ::fork();
    if (pid < 0) throw Error(ErrorKind::system, std::string("fork: ") + std::strerror(errno), "");
    if (pid == 0) {
      ::close(pipe_fds[0]);
      exec_rank(options, program, pipe_fds[1], environment, launcher);
    }
    ::close(pipe_fds[1]);
    child.pid = pid;
    child.output = pipe_fds[0];
  }
  say(strf("started %d rank%s (%d to %d of %d); logs in %s/", options.nproc_per_node,
           options.nproc_per_node == 1 ? "" : "s", children.front().rank, children.back().rank,
           options.nnodes * options.nproc_per_node, options.log_dir.c_str()));

  Child* first_failure = nullptr;
  bool killing = false;
  Clock::time_point kill_at{};
  auto running = [&] {
    int count = 0;
    for (const Child& child : children) count += child.running ? 1 : 0;
    return count;
  };
  auto signal_all = [&](int signal_number) {
    for (Child& child : children)
      if (child.running) ::kill(child.pid, signal_number);
  };
  auto reap = [&] {
    int status = 0;
    pid_t pid;
    while ((pid = ::waitpid(-1, &status, WNOHANG)) > 0) {
      for (Child& child : children) {
        if (child.pid != pid) continue;
        child.running = false;
        child.status = status;
        if (failed(status) && !first_failure && !killing) {
          first_failure = &child;
          say(strf("rank %d (pid %d) %s; stopping the other ranks", child.rank, static_cast<int>(pid),
                   describe_status(status).c_str()));
          signal_all(SIGTERM);
          killing = true;
          kill_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(options.kill_timeout_s));
        }
      }
    }
  };

  // Once every rank is reaped, output still held open by a rank's own children (a wrapper's
  // background process) is read for a short while more, then abandoned.
  Clock::time_point drain_until = Clock::time_point::max();
  for (;;) {
    std::vector<pollfd> fds{{signals, POLLIN, 0}};
    std::vector<Child*> owners{nullptr};
    for (Child& child : children) {
      if (child.output < 0) continue;
      fds.push_back({child.output, POLLIN, 0});
      owners.push_back(&child);
    }
    if (running() == 0) {
      if (drain_until == Clock::time_point::max()) drain_until = Clock::now() + std::chrono::seconds(2);
      if (fds.size() == 1 || Clock::now() >= drain_until) break;
    }
    if (killing && Clock::now() >= kill_at && running() > 0) {
      say(strf("%d rank(s) still running %.0f s after SIGTERM: sending SIGKILL", running(), options.kill_timeout_s));
      signal_all(SIGKILL);
      kill_at = Clock::time_point::max();
    }
    const int ready = ::poll(fds.data(), fds.size(), 200);
    if (ready < 0 && errno != EINTR) break;
    if (fds[0].revents & POLLIN) {
      unsigned char byte = 0;
      while (::read(signals, &byte, 1) == 1) {
        const int signal_number = byte;
        if (signal_number == SIGCHLD) continue;
        say(strf("received %s: forwarding it to %d rank(s) (they save a checkpoint and stop)",
                 strsignal(signal_number), running()));
        signal_all(signal_number);
      }
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Child& child = *owners[i];
      if (!pump_output(child, options.tail_lines)) {
        ::close(child.output);
        child.output = -1;
      }
    }
    reap();
  }
  for (size_t i = 0; i < 4; ++i) ::sigaction(kHandled[i], &previous[i], nullptr);
  ::close(signals);
  ::close(signal_pipe[1]);
  signal_pipe_write = -1;
  for (Child& child : children) {
    if (child.output >= 0) ::close(child.output);
    std::fclose(child.log);
  }

  if (!first_failure) {
    for (Child& child : children)
      if (failed(child.status)) first_failure = &child;  // e.g. a rank that did not survive a forwarded signal
  }
  if (!first_failure) {
    say(strf("all %d rank(s) finished", options.nproc_per_node));
    return 0;
  }
  std::string report = strf("rank %d (local rank %d on node %d, pid %d) %s; the job was stopped.\n",
                            first_failure->rank, first_failure->local_rank, options.node_rank,
                            static_cast<int>(first_failure->pid), describe_status(first_failure->status).c_str());
  report += strf("last %zu line(s) of rank %d (all of it in %s):\n", first_failure->tail.size(), first_failure->rank,
                 first_failure->log_path.c_str());
  for (const std::string& line : first_failure->tail) report += "    " + line + "\n";
  std::fprintf(stderr, "mxtrain launch: %s", report.c_str());
  std::fflush(stderr);
  const int code = exit_code_of(first_failure->status);
  return code == 0 ? 1 : code;
}

}  // namespace mxtrain::runtime
