// Helpers for tests that run mxtrain as separate processes and signal them: a background
// process with its output in a file, polling with a deadline, and reading a run directory's
// step losses and checkpoints.
#pragma once
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/test_support.hpp"

namespace mxtrain::test {

// `command` run by /bin/sh (exec'd, so pid() is the command itself), stdout and stderr to
// output_path, extra environment variables on top of this process's.
class BackgroundProcess {
 public:
  BackgroundProcess(const std::string& command, std::string output_path,
                    const std::map<std::string, std::string>& environment = {})
      : output_path_(std::move(output_path)) {
    pid_ = ::fork();
    if (pid_ == 0) {
      for (const auto& [name, value] : environment) ::setenv(name.c_str(), value.c_str(), 1);
      const std::string line = "exec " + command + " >" + output_path_ + " 2>&1";
      ::execl("/bin/sh", "sh", "-c", line.c_str(), static_cast<char*>(nullptr));
      ::_exit(127);
    }
  }
  ~BackgroundProcess() {
    if (!status_ && pid_ > 0) {
      ::kill(pid_, SIGKILL);
      int status = 0;
      ::waitpid(pid_, &status, 0);
    }
  }
  BackgroundProcess(const BackgroundProcess&) = delete;
  BackgroundProcess& operator=(const BackgroundProcess&) = delete;

  pid_t pid() const { return pid_; }
  void signal(int signal_number) const { ::kill(pid_, signal_number); }
  // The waitpid status once the process ended, or nothing when it still runs after timeout_s.
  std::optional<int> wait(double timeout_s) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    while (!status_) {
      int status = 0;
      if (::waitpid(pid_, &status, WNOHANG) == pid_) {
        status_ = status;
        break;
      }
      if (std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return status_;
  }
  std::string output() const {
    std::ifstream in(output_path_);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }

 private:
  pid_t pid_ = -1;
  std::string output_path_;
  std::optional<int> status_;
};

inline bool wait_until(const std::function<bool()>& condition, double timeout_s) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
  while (std::chrono::steady_clock::now() < deadline) {
    if (condition()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return condition();
}

// step -> loss from a run's metrics.jsonl (a later line for the same step wins).
inline std::map<int64_t, double> step_losses(const std::string& run_dir) {
  std::map<int64_t, double> result;
  std::ifstream in(run_dir + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    nlohmann::json record = nlohmann::json::parse(line, nullptr, false);
    if (record.is_discarded()) continue;  // a line cut short by SIGKILL
    if (record.contains("loss")) result[record["step"].get<int64_t>()] = record["loss"].get<double>();
  }
  return result;
}

// Complete checkpoints (with a manifest) of a run directory, oldest first.
inline std::vector<std::string> complete_checkpoints(const std::string& run_dir) {
  std::vector<std::string> found;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(run_dir + "/checkpoints", error)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("step_", 0) == 0 && name.find(".tmp") == std::string::npos &&
        std::filesystem::exists(entry.path() / "manifest.json"))
      found.push_back(entry.path().string());
  }
  std::sort(found.begin(), found.end());
  return found;
}

inline int64_t checkpoint_step(const std::string& path) {
  return std::stoll(path.substr(path.rfind("step_") + 5));
}

// Both runs logged exactly `steps` step losses, and they are equal step by step.
inline void expect_same_losses(const std::string& run_dir, const std::string& reference_dir, int64_t steps) {
  std::map<int64_t, double> got = step_losses(run_dir), expected = step_losses(reference_dir);
  ASSERT_EQ(expected.size(), static_cast<size_t>(steps));
  ASSERT_EQ(got.size(), static_cast<size_t>(steps));
  for (int64_t step = 1; step <= steps; ++step) EXPECT_EQ(got[step], expected[step]) << "step " << step;
}

// After a stop signal ended `run_dir`'s job: it holds exactly one complete checkpoint, at the last
// step its metrics reached; `command(dir, steps)` run again on it resumes from that checkpoint,
// and `extra_steps` later its losses equal an uninterrupted run of the same length in
// `reference_dir`. `stop_output` (the stopped job's output) is printed on failure.
inline void expect_stopped_run_resumes_exactly(const std::string& run_dir, const std::string& reference_dir,
                                               const std::function<std::string(const std::string&, int64_t)>& command,
                                               int64_t extra_steps, const std::string& stop_output) {
  std::vector<std::string> saved = complete_checkpoints(run_dir);
  ASSERT_EQ(saved.size(), 1u) << stop_output;
  const int64_t stopped_at = checkpoint_step(saved.back());
  EXPECT_EQ(static_cast<int64_t>(step_losses(run_dir).size()), stopped_at);

  std::string output;
  ASSERT_EQ(run_command(command(run_dir, stopped_at + extra_steps), &output), 0) << output;
  EXPECT_NE(output.find("resumed from " + saved.back() + " at step " + std::to_string(stopped_at)), std::string::npos)
      << output;
  ASSERT_EQ(run_command(command(reference_dir, stopped_at + extra_steps), &output), 0) << output;
  expect_same_losses(run_dir, reference_dir, stopped_at + extra_steps);
}

}  // namespace mxtrain::test

namespace mxtrain::test {

// `mxtrain train` flags of a run small enough for CI: a 2-block model of hidden 64 on the test
// corpus, fp32 on the CPU, one thread, a constant learning rate after warm-up (so a run can be
// extended with --steps and still equal a longer run), checkpoints only when asked.
inline std::string tiny_train_flags(const std::string& corpus, const std::string& run_dir) {
  return "--set model.hidden=64 --set model.heads=2 --set model.kv_heads=1 --set model.layers=2 "
         "--set model.ffn_hidden=128 -s 32 -b 4 --global-batch 8 -d cpu --set train.threads=1 "
         "--set schedule.warmup_steps=2 --set schedule.decay=constant --set eval.every=0 --set eval.batches=1 "
         "--set checkpoint.every=0 --set data.train=" + corpus + "/train_*.bin --set data.val=" + corpus +
         "/val_*.bin -o " + run_dir;
}

}  // namespace mxtrain::test
