// A progress line with an ETA for long work (prepare, checkpoint writes, tune trials). On a
// terminal it redraws one line on stderr at most four times a second; otherwise (a log file, a
// SageMaker job) it prints a line at most every `log_interval_s` seconds, so logs stay short.
// finish() prints the final line with the elapsed time. Work that is usually quick (a checkpoint
// write) sets quiet_for(seconds): nothing is printed unless it runs longer than that.
#pragma once
#include <chrono>
#include <cstdint>
#include <string>

namespace mxtrain {

class Progress {
 public:
  // `unit` is "bytes" (shown in kB/MB/GB) or a noun counted as is ("trials", "steps").
  Progress(std::string label, double total, std::string unit = "bytes", double log_interval_s = 10.0);
  void update(double done);
  void finish();
  // No line at all until `seconds` have passed; finish() then prints only if the work took longer.
  void quiet_for(double seconds) { quiet_s_ = seconds; }
  // The line for `done` without printing it, for work that logs its own lines between steps
  // (tune's trials): "tune: 40% 2 trials / 5 trials, 0.01 trials/s, ETA 4m10s".
  std::string text(double done) const { return line(done, false); }

  // "1h02m", "3m05s", "12s": how the ETA and elapsed times are written.
  static std::string duration(double seconds);

 private:
  std::string line(double done, bool final) const;

  std::string label_, unit_;
  double total_, log_interval_s_;
  double quiet_s_ = 0;
  bool terminal_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_print_;
};

}  // namespace mxtrain
