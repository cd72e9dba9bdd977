#include "mxtrain/core/progress.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>

#include "mxtrain/core/error.hpp"

namespace mxtrain {

namespace {

std::string amount(double value, const std::string& unit) {
  if (unit != "bytes") return strf("%.0f %s", value, unit.c_str());
  if (value >= 1e9) return strf("%.2f GB", value / 1e9);
  if (value >= 1e6) return strf("%.1f MB", value / 1e6);
  return strf("%.0f kB", value / 1e3);
}

double seconds_between(std::chrono::steady_clock::time_point a, std::chrono::steady_clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

}  // namespace

Progress::Progress(std::string label, double total, std::string unit, double log_interval_s)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), log_interval_s_(log_interval_s),
      terminal_(::isatty(STDERR_FILENO) == 1), start_(std::chrono::steady_clock::now()), last_print_(start_) {}

std::string Progress::duration(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return "?";
  const long long s = std::llround(seconds);
  if (s >= 3600) return strf("%lldh%02lldm", s / 3600, (s / 60) % 60);
  if (s >= 60) return strf("%lldm%02llds", s / 60, s % 60);
  return strf("%llds", s);
}

std::string Progress::line(double done, bool final) const {
  const double elapsed = seconds_between(start_, std::chrono::steady_clock::now());
  const double fraction = total_ > 0 ? std::min(1.0, done / total_) : 1.0;
  std::string text = strf("%s: %3.0f%% %s / %s", label_.c_str(), 100 * fraction, amount(done, unit_).c_str(),
                          amount(total_, unit_).c_str());
  if (elapsed > 0 && done > 0) {
    const double rate = done / elapsed;
    text += unit_ == "bytes" ? ", " + amount(rate, unit_) + "/s" : strf(", %.2f %s/s", rate, unit_.c_str());
    text += final ? ", took " + duration(elapsed) : ", ETA " + duration((total_ - done) / rate);
  }
  return text;
}

void Progress::update(double done) {
  const auto now = std::chrono::steady_clock::now();
  if (seconds_between(start_, now) < quiet_s_) return;
  const double since = seconds_between(last_print_, now);
  if (since < (terminal_ ? 0.25 : log_interval_s_)) return;
  last_print_ = now;
  if (terminal_) {
    std::fprintf(stderr, "\r%s\033[K", line(done, false).c_str());
    drawn_ = true;
  } else {
    std::fprintf(stderr, "%s\n", line(done, false).c_str());
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (quiet_s_ > 0 && seconds_between(start_, std::chrono::steady_clock::now()) < quiet_s_) return;
  const std::string text = line(total_, true);
  std::fprintf(stderr, terminal_ && drawn_ ? "\r%s\033[K\n" : "%s\n", text.c_str());
  std::fflush(stderr);
}

}  // namespace mxtrain
