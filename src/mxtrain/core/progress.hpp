// A progress line with an ETA for long work (prepare, checkpoint writes, tune trials). On a
// terminal it redraws one line on stderr at most four times a second; otherwise (a log file, a
// SageMaker job) it prints a line at most every `log_interval_s` seconds, so logs stay short.
// finish() prints the final line with the elapsed time.
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

  // "1h02m", "3m05s", "12s": how the ETA and elapsed times are written.
  static std::string duration(double seconds);

 private:
  std::string line(double done, bool final) const;

  std::string label_, unit_;
  double total_, log_interval_s_;
  bool terminal_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point start_, last_print_;
};

}  // namespace mxtrain
